"""Bring recorded runs and sweep points up to date: the state of any number of them from
one status call per backend (for Slurm one squeue -r and at most one sacct, plain jobs
and array tasks alike), the final exit code once a job ended.

A sweep point's array script notes its own end (records.JOB_END): a point that ended 0
is COMPLETED without asking anyone; what a refresh learns is written into run.json, so
a job Slurm purged long ago (MinJobAge) still reads right and a finished one asks
nothing at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from hpclaunch.backends import for_record, packstatus
from hpclaunch.basics import states
from hpclaunch.errors import HpclaunchError
from hpclaunch.observe.jobend import JobStatus, chain_status, job_exit_code
from hpclaunch.records import runpaths, runrecord
from hpclaunch.records.runpaths import rank_logs
from hpclaunch.records.runrecord import RunRecord

if TYPE_CHECKING:
    from hpclaunch.backends.base import Backend

# Worth a write to run.json: what a later refresh could not learn again. A pending
# reason alone only changes what is shown, so a refresh of 1,000 held points writes nothing.
_DURABLE = ("state", "exit_code", "slurm_job_id", "ended_at")


def is_open(record: RunRecord) -> bool:
    """Not ended yet: created, pending, running (the one definition for runs and points)."""
    return states.is_open(record.state)


def needs_asking(record: RunRecord) -> bool:
    return bool(record.job_id) and not record.step and is_open(record)


class _Backends:
    """One backend per recorded name for a whole refresh (one memory, one count)."""

    def __init__(self, given: Optional[Backend]) -> None:
        self._given = given
        self._made: dict[str, Backend] = {}

    def of(self, record: RunRecord) -> Backend:
        if self._given is not None and self._given.name == record.backend:
            return self._given
        if record.backend not in self._made:
            self._made[record.backend] = for_record(record.backend)
        return self._made[record.backend]


def refresh(
    runs: Sequence[RunRecord],
    *,
    asked: Optional[list[str]] = None,
    backend: Optional[Backend] = None,
) -> list[RunRecord]:
    """The same runs (sweep points among them), those that may have changed asked about
    in one status call per backend; the scheduler commands run go to `asked`."""
    backends = _Backends(backend)
    runs = [_settled(r, backends.of(r)) for r in runs]
    learnt: dict[int, RunRecord] = {}
    asking: dict[str, list[RunRecord]] = {}
    for rec in runs:
        if not needs_asking(rec):
            continue
        end = runrecord.job_event(rec.path, runrecord.JOB_END, str(rec.job_id))
        if end is not None and end.get("exit_code") == 0:
            learnt[id(rec)] = _write(rec, _ended(rec, end))
        else:  # a failed end may be a scancel or the time limit: the scheduler names which
            asking.setdefault(rec.backend, []).append(rec)
    for group in asking.values():
        chosen = backends.of(group[0])
        for rec in group:
            chosen.learn(rec)
        try:
            found = chosen.status([job for rec in group for job in _job_ids(rec)])
        except HpclaunchError:
            continue  # the scheduler does not answer: show what was recorded
        finally:
            if asked is not None:
                asked.extend(chosen.commands_run())
        for rec in group:
            learnt[id(rec)] = _updated(rec, _status(rec, found), chosen)
    return [learnt.get(id(r), r) for r in runs]


def _settled(record: RunRecord, backend: Backend) -> RunRecord:
    """A record whose supervisor is gone (a local run's launcher SIGKILLed) as it ended."""
    if not is_open(record):
        return record
    changes = backend.settle(record)
    return _stored(record, changes) if changes else record


def _job_ids(record: RunRecord) -> list[str]:
    """A --chain run's members, a packed point's allocation, else its one job."""
    if packstatus.is_packed(record):
        return [packstatus.allocation(record)]
    return record.job_ids if len(record.job_ids) > 1 else [str(record.job_id)]


def _status(record: RunRecord, found: Mapping[str, JobStatus]) -> Optional[JobStatus]:
    if packstatus.is_packed(record):
        return found.get(packstatus.allocation(record))
    if len(record.job_ids) > 1 and "_" not in str(record.job_id):
        ran = [a.number for a in record.events.attempts]
        return chain_status(record.job_ids, found, ran)
    return found.get(str(record.job_id))


def _ended(record: RunRecord, end: Mapping[str, Any]) -> dict[str, Any]:
    """A job's own end event (a sweep point's array script: its job.sh ended with rc)."""
    rc = end.get("exit_code")
    if rc == 0:
        return {"state": states.State.COMPLETED.value, "exit_code": 0, "ended_at": end.get("time")}
    given = f"{rc}:0" if isinstance(rc, int) else None
    code = job_exit_code(states.State.FAILED.value, rank_logs(record.path), given)
    return {"state": states.State.FAILED.value, "exit_code": code, "ended_at": end.get("time")}


def _updated(record: RunRecord, status: Optional[JobStatus], backend: Backend) -> RunRecord:
    if packstatus.is_packed(record):  # a run in a slot of the pack's allocation
        return _write(record, packstatus.changes(record, status))
    end = runrecord.job_event(record.path, runrecord.JOB_END, str(record.job_id))
    if status is None:  # the scheduler forgot it: the job's own word, if it left one
        return _write(record, _ended(record, end)) if end is not None else record
    state = states.parse(status.state)
    changes: dict[str, Any] = {"state": state.value, "reason": status.reason}
    changes.update(backend.record_extra(str(record.job_id)))
    if not states.is_active(state) and state != states.State.UNKNOWN:
        if end is not None and states.exit_code_for(state) is None:
            # COMPLETED/FAILED: the job's own exit code is the precise one; CANCELLED,
            # TIMEOUT, NODE_FAIL, ... say why its job.sh ended and win over it.
            changes.update(_ended(record, end))
        else:
            logs = rank_logs(record.path)
            changes["exit_code"] = job_exit_code(state.value, logs, status.exit_code)
    if state == states.State.CANCELLED and record.extra.get("after"):
        changes["reason"] = why_never_started(record) or status.reason
    setup = setup_failure(record.path, record.events)
    if state == states.State.FAILED and setup:
        changes["reason"] = setup
    return _write(record, changes)


def _value(record: RunRecord, key: str) -> Any:
    return getattr(record, key) if hasattr(record, key) else record.extra.get(key)


def _write(record: RunRecord, changes: dict[str, Any]) -> RunRecord:
    """Write what a later refresh could not learn again; the rest is only shown."""
    if all(_value(record, k) == v for k, v in changes.items()):
        return record
    if not any(_value(record, k) != changes[k] for k in _DURABLE if k in changes):
        return replace(record, reason=str(changes.get("reason", record.reason)))
    return _stored(record, changes)


def _stored(record: RunRecord, changes: Mapping[str, object]) -> RunRecord:
    """The record with the changes, written back; on a full disk (or a file system that
    fails now) shown as changed and written by a later refresh."""
    try:
        runrecord.update(record.path, **changes)
    except OSError:
        known = {k: v for k, v in changes.items() if hasattr(record, k)}
        return replace(record, **known)  # type: ignore[arg-type]  # RunRecord fields
    return runrecord.load(record.path)


def refresh_one(run_dir: Path) -> RunRecord:
    return refresh([runrecord.load(run_dir)])[0]


def setup_failure(run_dir: Path, events: runrecord.RankEvents) -> Optional[str]:
    """The reason of a run whose batch script stopped in a --setup line (no rank started),
    else None: what its record says (the lines' own output is in logs/batch.out)."""
    if events.setup_failed is None or events.started:
        return None
    log = run_dir / "logs" / "batch.out"
    # The setup's last words ("module: command not found") in the reason itself: on a
    # cluster the error is this line, read long after the job's output scrolled by.
    said = [line for line in runpaths.log_tail(log) if not line.startswith("hpclaunch")][-1:]
    words = f": {said[0].strip()[:200]}" if said else ""
    return f"a --setup line failed (exit {events.setup_failed}){words}; see {log}"


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
        except (OSError, runrecord.DamagedRecord):
            continue
        cond = str(dep.get("condition", "ok"))
        ok = other.state == states.State.COMPLETED
        if cond != "any" and not states.is_open(other.state) and ok == (cond == "notok"):
            return f"never started: --after {other.run_id}:{cond}, and it ended {other.state}"
    return None
