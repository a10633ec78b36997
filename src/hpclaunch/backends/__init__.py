"""Backends: every way a planned run can run, behind one interface (base.Backend).

`chosen` is the one place that decides which backend runs a new run (from the profile
and whether this process runs inside an allocation), `pick` makes it; `of_record` /
`for_record` give the one that answers for a recorded run. Nothing outside this folder
asks a backend's name: it asks the chosen backend a question (`runs_here`,
`asks_sinfo`, `snapshots_by_default`, `step_of_allocation`, `foreground`, ...;
tests/test_layout.py holds the rule). Imported lazily: only the chosen backend's code loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpclaunch.config.profilekinds import runs_here

if TYPE_CHECKING:  # base imports render, which imports modules that ask kinds.py
    from hpclaunch.backends.base import Backend
    from hpclaunch.config.profiles import Profile
    from hpclaunch.records.runrecord import RunRecord


def chosen(profile: Profile, in_allocation: bool) -> type[Backend]:
    """A local profile -> local processes; inside an allocation -> a step of it; else sbatch."""
    if runs_here(profile.kind):
        from hpclaunch.backends.local import LocalBackend

        return LocalBackend
    if in_allocation:
        from hpclaunch.backends.step import StepBackend

        return StepBackend
    from hpclaunch.backends.slurm import SlurmBackend

    return SlurmBackend


def pick(profile: Profile, in_allocation: bool) -> Backend:
    """The backend that plans and starts a new run (chosen once: launching.plan_run)."""
    return chosen(profile, in_allocation)()


def for_record(backend: str) -> Backend:
    """The backend that answers for a run recorded with `backend` ("local", "slurm")."""
    if backend == "local":
        from hpclaunch.backends.local import LocalBackend

        return LocalBackend()
    from hpclaunch.backends.slurm import SlurmBackend

    return SlurmBackend()


def of_record(record: RunRecord) -> Backend:
    """The backend a recorded run ran under, a step of an allocation included."""
    if record.step and record.backend != "local":
        from hpclaunch.backends.step import StepBackend

        return StepBackend()
    return for_record(record.backend)


__all__ = ["chosen", "for_record", "of_record", "pick"]
