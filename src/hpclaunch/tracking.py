"""Bring recorded runs up to date: the state of any number of runs from one status call
per backend (for Slurm one squeue and one sacct), the final exit code once a job ended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Optional

from . import records, states
from .backends import for_record
from .backends.watchdog import LAUNCHER_GONE, launcher_gone
from .errors import HpclaunchError
from .monitor import JobStatus, chain_status, job_exit_code
from .records import RunRecord
from .rundirs import rank_logs


def needs_asking(record: RunRecord) -> bool:
    if record.backend != "slurm" or not record.job_id or record.step or _is_point(record):
        return False
    return states.is_open(record.state)


def _local_truth(record: RunRecord) -> RunRecord:
    """A local run recorded as running whose launcher is gone (SIGKILLed, the machine
    rebooted) did not run on: its watchdog ended the ranks. Say so in the record."""
    pid = record.launcher_pid
    if record.backend != "local" or not states.is_open(record.state) or pid is None:
        return record
    gone = launcher_gone(pid, record.launcher_started)
    if gone is None:
        return record
    ended = _ranks_ended(record)
    if ended is not None:  # its end was not recorded (a full disk): the ranks tell it
        return _stored(record, ended)
    reason = f"hpclaunch (pid {pid}) ended before the run; its ranks were ended"
    if gone != "ended":
        reason += f" ({gone})"
    changes: dict[str, object] = {
        "state": states.State.CANCELLED.value,
        "exit_code": states.exit_code_for(states.State.CANCELLED),
        "reason": reason,
    }
    return _stored(record, changes)


def _ranks_ended(record: RunRecord) -> Optional[dict[str, object]]:
    """A local run whose every rank exited 0, the end its launcher could not write (a
    full disk): COMPLETED. Ranks that failed or were killed could also have been ended by
    the watchdog, whose own event may not be written yet: those stay CANCELLED."""
    found = record.events
    size = record.world_size
    if not size or len(found.returncodes) < size or found.attempts:
        return None
    if any(found.returncodes.values()):
        return None
    if any(e.get("event") == LAUNCHER_GONE for e in records.event_lines(record.path)):
        return None
    return {"state": states.State.COMPLETED.value, "exit_code": 0, "ended_at": found.last_end}


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
        found = for_record("slurm").status([job for r in asking for job in _job_ids(r)])
    except HpclaunchError:
        return list(runs)  # Slurm does not answer: show what was recorded
    asked = {id(r) for r in asking}
    return [_updated(r, _status(r, found)) if id(r) in asked else r for r in runs]


def _job_ids(record: RunRecord) -> list[str]:
    """A --chain run's members, else its one job."""
    return record.job_ids if len(record.job_ids) > 1 else [str(record.job_id)]


def _status(record: RunRecord, found: Mapping[str, JobStatus]) -> Optional[JobStatus]:
    if len(record.job_ids) > 1:
        ran = [a.number for a in record.events.attempts]
        return chain_status(record.job_ids, found, ran)
    return found.get(str(record.job_id))


def _updated(record: RunRecord, status: Optional[JobStatus]) -> RunRecord:
    if status is None:
        return record
    state = states.parse(status.state)
    changes: dict[str, object] = {"state": state.value, "reason": status.reason}
    if not states.is_active(state) and state != states.State.UNKNOWN:
        changes["exit_code"] = job_exit_code(state.value, rank_logs(record.path), status.exit_code)
    if state == states.State.CANCELLED and record.extra.get("after"):
        changes["reason"] = why_never_started(record) or status.reason
    if all(getattr(record, k) == v for k, v in changes.items()):
        return record
    return _stored(record, changes)


def _stored(record: RunRecord, changes: dict[str, object]) -> RunRecord:
    """The record with the changes, written back; on a full disk (or a file system that
    fails now) shown as changed and written by a later refresh."""
    try:
        records.update(record.path, **changes)
    except OSError:
        return replace(record, **changes)  # type: ignore[arg-type]  # RunRecord fields
    return records.load(record.path)


def refresh_one(run_dir: Path) -> RunRecord:
    return refresh([records.load(run_dir)])[0]


def why_never_started(record: RunRecord) -> Optional[str]:
    """For a run Slurm cancelled before it started: the --after that failed, from the
    records of the runs it waited for (Slurm's own reason is gone once it purges)."""
    waited = record.extra.get("after")
    if not isinstance(waited, list) or record.events.started:
        return None
    for dep in waited:
        if not isinstance(dep, dict) or not dep.get("job_ids") or not dep.get("run_dir"):
            continue
        folder = Path(str(dep["run_dir"]))
        if (folder / "sweep.json").is_file():
            continue  # a sweep's points: its own status says which failed
        try:
            other = refresh_one(folder)
        except (OSError, records.DamagedRecord):
            continue
        cond = str(dep.get("condition", "ok"))
        ok = other.state == states.State.COMPLETED
        if cond != "any" and not states.is_open(other.state) and ok == (cond == "notok"):
            return f"never started: --after {other.run_id}:{cond}, and it ended {other.state}"
    return None
