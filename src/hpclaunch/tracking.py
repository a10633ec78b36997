"""Bring recorded runs up to date: the state of any number of runs from one status call
per backend (for Slurm one squeue and one sacct), the final exit code once a job ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from . import records, states
from .backends import for_record
from .backends.watchdog import launcher_alive
from .errors import HpclaunchError
from .monitor import JobStatus, job_exit_code
from .records import RunRecord
from .rundirs import rank_logs

_OPEN = {"CREATED"}  # recorded before the backend answered: ask it


def needs_asking(record: RunRecord) -> bool:
    if record.backend != "slurm" or not record.job_id or record.step or _is_point(record):
        return False
    return _is_open(record)


def _is_open(record: RunRecord) -> bool:
    return record.state in _OPEN or states.is_active(states.parse(record.state))


def _local_truth(record: RunRecord) -> RunRecord:
    """A local run recorded as running whose launcher is gone (SIGKILLed, the machine
    rebooted) did not run on: its watchdog ended the ranks. Say so in the record."""
    pid = record.launcher_pid
    if record.backend != "local" or not _is_open(record) or pid is None:
        return record
    if launcher_alive(pid, record.launcher_started):
        return record
    reason = f"hpclaunch (pid {pid}) ended before the run; its ranks were ended"
    records.update(
        record.path,
        state=states.State.CANCELLED.value,
        exit_code=states.exit_code_for(states.State.CANCELLED),
        reason=reason,
    )
    return records.load(record.path)


def _is_point(record: RunRecord) -> bool:
    return "sweep_id" in record.extra


def refresh(runs: Sequence[RunRecord]) -> list[RunRecord]:
    """The same runs, those that may have changed asked about in one call."""
    runs = [_local_truth(r) for r in runs]
    if any(_is_point(r) and r.backend == "slurm" for r in runs):
        # A sweep's points (SWEEP:I): their own end events, one squeue -r, one sacct.
        from .sweeps.pointstate import Asked, refresh_points

        changed = refresh_points(runs, Asked())
        runs = [changed.get(r.path, r) for r in runs]
    asking = [r for r in runs if needs_asking(r)]
    if not asking:
        return list(runs)
    try:
        found = for_record("slurm").status([str(r.job_id) for r in asking])
    except HpclaunchError:
        return list(runs)  # Slurm does not answer: show what was recorded
    asked = {id(r) for r in asking}
    return [_updated(r, found.get(str(r.job_id))) if id(r) in asked else r for r in runs]


def _updated(record: RunRecord, status: Optional[JobStatus]) -> RunRecord:
    if status is None:
        return record
    state = states.parse(status.state)
    changes: dict[str, object] = {"state": state.value, "reason": status.reason}
    if not states.is_active(state) and state != states.State.UNKNOWN:
        changes["exit_code"] = job_exit_code(state.value, rank_logs(record.path), status.exit_code)
    if all(getattr(record, k) == v for k, v in changes.items()):
        return record
    records.update(record.path, **changes)
    return records.load(record.path)


def refresh_one(run_dir: Path) -> RunRecord:
    return refresh([records.load(run_dir)])[0]
