"""Backends: every way a planned run can run, behind one interface (base.Backend).

`pick` is the one place that decides which backend runs a new run; `for_record` which
one answers for a recorded run. Imported lazily: only the chosen backend's code loads.
"""

from __future__ import annotations

from .base import Backend


def pick(profile_kind: str, in_allocation: bool) -> Backend:
    """local profile -> local processes; inside an allocation -> a step of it; else sbatch."""
    if profile_kind == "local":
        from .local import LocalBackend

        return LocalBackend()
    if in_allocation:
        from .step import StepBackend

        return StepBackend()
    from .slurm import SlurmBackend

    return SlurmBackend()


def for_record(backend: str) -> Backend:
    """The backend that answers for a run recorded with `backend` ("local", "slurm")."""
    return pick("local" if backend == "local" else "slurm", in_allocation=False)


__all__ = ["Backend", "for_record", "pick"]
