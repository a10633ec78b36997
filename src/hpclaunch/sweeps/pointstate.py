"""The state of sweep points that Slurm runs, asked the way the scheduler likes: the
points' own end events first (no Slurm call), then ONE `squeue -r -t all -j A1,A2,...`
for the arrays of the points still open, then at most ONE sacct call (the database, else
the job completion file, `sacct -c`) for the points neither knows. What is learnt is
written into the points' run.json, so a sweep whose jobs Slurm purged long ago
(MinJobAge) still reads right, and a finished sweep asks Slurm nothing at all.

Used for whole sweeps (track.py) and for single points named SWEEP:I (tracking.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from .. import records, slurmcmd, states
from ..errors import SlurmError
from ..monitor import job_exit_code
from ..records import RunRecord
from ..rundirs import rank_logs
from ..states import State
from . import arrays, record

SACCT_MODES = ("-X", "-c")  # the accounting database; the job completion file


@dataclass
class Asked:
    """What a refresh asked of Slurm (the commands, for counting), and which sacct mode
    answers at this site: learnt at submission from AccountingStorageType and kept in
    sweep.json, so a refresh never spends a call finding out."""

    commands: list[str] = field(default_factory=list)
    sacct_mode: Optional[str] = None


def is_point(rec: RunRecord) -> bool:
    return rec.backend == "slurm" and "sweep_id" in rec.extra


def is_open(rec: RunRecord) -> bool:
    return states.is_open(rec.state)


def refresh_points(recs: Sequence[RunRecord], asked: Asked) -> dict[Path, RunRecord]:
    """Those of `recs` that changed, brought up to date (Slurm points only); what was
    asked of Slurm goes to `asked`."""
    open_ = [r for r in recs if is_point(r) and r.job_id and is_open(r)]
    changes: dict[Path, dict[str, Any]] = {}
    rest = []
    for rec in open_:
        end = record.point_end(rec.path, str(rec.job_id))
        if end is not None and end.get("exit_code") == 0:
            changes[rec.path] = _ended(rec, end)
        else:  # a failed end may be a scancel or the time limit: Slurm names which
            rest.append(rec)
    if rest:
        changes.update(_ask_slurm(rest, asked))
    by_path = {r.path: r for r in open_}
    return {path: _write(by_path[path], change) for path, change in changes.items()}


def _ended(rec: RunRecord, end: dict[str, Any]) -> dict[str, Any]:
    """The array script's own point_end event: the point's job.sh ended with this code."""
    rc = end.get("exit_code")
    if rc == 0:
        return {"state": State.COMPLETED.value, "exit_code": 0, "ended_at": end.get("time")}
    code = job_exit_code(
        State.FAILED, rank_logs(rec.path), f"{rc}:0" if isinstance(rc, int) else None
    )
    return {"state": State.FAILED.value, "exit_code": code, "ended_at": end.get("time")}


def _ask_slurm(rest: Sequence[RunRecord], asked: Asked) -> dict[Path, dict[str, Any]]:
    keys = {rec.path: _task_key(str(rec.job_id)) for rec in rest}
    array_ids = sorted({k[0] for k in keys.values()}, key=_numeric)
    found: dict[tuple[str, int], arrays.TaskState] = {}
    try:
        out = slurmcmd.run([*arrays.SQUEUE_ARGV, "-j", ",".join(array_ids)], timeout=30)
        found = arrays.parse_squeue(out)
    except SlurmError:
        pass  # squeue refuses a list of ids it all forgot: accounting answers
    asked.commands.append("squeue")
    missing = [r for r in rest if keys[r.path] not in found]
    if missing:
        # The completion file (sacct -c) knows a task only by its own job id (recorded
        # when the point started, or seen in squeue), a never-started one by its array's.
        known: dict[str, list[tuple[str, int]]] = {}
        for rec in missing:
            own = _own_job_id(rec) or keys[rec.path][0]
            known.setdefault(own, []).append(keys[rec.path])
        ids = sorted({keys[r.path][0] for r in missing} | set(known), key=_numeric)
        found.update(_sacct(ids, known, asked))
    learnt: dict[Path, dict[str, Any]] = {}
    listed = {key[0] for key in found}
    for rec in rest:
        task = found.get(keys[rec.path])
        end = record.point_end(rec.path, str(rec.job_id))
        if task is not None:
            learnt[rec.path] = _from_task(rec, task)
        elif end is not None:  # Slurm forgot it: the point's own word
            learnt[rec.path] = _ended(rec, end)
        elif keys[rec.path][0] in listed and not _own_job_id(rec):
            # scancel of one pending task takes it out of its array's record: no job
            # record, no accounting line is left, while its siblings are still listed.
            learnt[rec.path] = {
                "state": states.State.CANCELLED.value,
                "exit_code": states.exit_code_for(states.State.CANCELLED),
                "reason": "cancelled while pending",
            }
    return learnt


def _numeric(text: str) -> tuple[int, str]:
    return (int(text), "") if text.isdigit() else (0, text)


def _task_key(job: str) -> tuple[str, int]:
    array_id, _, task = job.partition("_")
    return array_id, int(task) if task.isdigit() else -1


def _own_job_id(rec: RunRecord) -> str:
    """The task's own job id: seen in squeue before, or noted when the point started."""
    if rec.extra.get("slurm_job_id"):
        return str(rec.extra["slurm_job_id"])
    start = record.point_started(rec.path, str(rec.job_id))
    return str(start.get("job_id") or "") if start else ""


def _sacct(
    ids: Sequence[str], known: dict[str, list[tuple[str, int]]], asked: Asked
) -> dict[tuple[str, int], arrays.TaskState]:
    """One sacct call in the mode the site answers (the other only if that one fails)."""
    modes = [m for m in SACCT_MODES if m == asked.sacct_mode]
    modes += [m for m in SACCT_MODES if m not in modes]
    for mode in modes:
        argv = ["sacct", mode, "-n", "-P", "-j", ",".join(ids), "-o", arrays.SACCT_FIELDS]
        asked.commands.append("sacct")
        try:
            found = arrays.parse_sacct(slurmcmd.run(argv, timeout=30), known)
        except SlurmError:
            continue
        asked.sacct_mode = mode
        return found
    return {}


def _from_task(rec: RunRecord, task: arrays.TaskState) -> dict[str, Any]:
    state = states.parse(task.state)
    changes: dict[str, Any] = {"state": state.value, "reason": task.reason}
    if task.job_id and task.job_id != task.array_job_id:
        changes["slurm_job_id"] = task.job_id  # what sacct -c will know it by
    if not states.is_active(state) and state != states.State.UNKNOWN:
        end = record.point_end(rec.path, str(rec.job_id))
        if end is not None and states.exit_code_for(state) is None:
            # COMPLETED/FAILED: the point's own exit code is the precise one; CANCELLED,
            # TIMEOUT, NODE_FAIL, ... say why its job.sh ended and win over it.
            return _ended(rec, end)
        code = None if task.exit_code is None else f"{task.exit_code}:0"
        changes["exit_code"] = job_exit_code(state.value, rank_logs(rec.path), code)
    return changes


_DURABLE = ("state", "exit_code", "slurm_job_id", "ended_at")  # worth a write to run.json


def _write(rec: RunRecord, changes: dict[str, Any]) -> RunRecord:
    """Write what a later refresh could not learn again (a state, an exit code, the id
    sacct -c knows the task by); a pending reason alone only changes what is shown, so
    a refresh of 1,000 held points writes nothing."""
    if all(getattr(rec, k, rec.extra.get(k)) == v for k, v in changes.items()):
        return rec
    if not any(getattr(rec, k, rec.extra.get(k)) != changes[k] for k in _DURABLE if k in changes):
        return replace(rec, reason=str(changes.get("reason", rec.reason)))
    records.update(rec.path, **changes)
    return records.load(rec.path)
