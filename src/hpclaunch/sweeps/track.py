"""A sweep brought up to date with the scheduler's load in mind: the points' own end
events first (no Slurm call), then ONE `squeue -r -t all -j A1,A2,...` for the arrays of
the points still open, then at most ONE sacct call (the database, else the job
completion file, `sacct -c`) for the points neither knows. What is learnt is written
into the points' run.json, so a sweep whose jobs Slurm purged long ago (MinJobAge)
still reads right, and a finished sweep asks Slurm nothing at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .. import records, slurmcmd, states, tracking
from ..errors import SlurmError
from ..monitor import job_exit_code
from ..records import RunRecord
from . import arrays, record

_SACCT_MODES: tuple[tuple[str, ...], ...] = (("-X",), ("-c",))


@dataclass
class Sweep:
    """A sweep record and its points' records, as of the last refresh."""

    data: dict[str, Any]
    points: list[RunRecord]
    asked: tuple[str, ...] = ()  # the Slurm commands this refresh ran (squeue, sacct)

    @property
    def sweep_dir(self) -> Path:
        return Path(self.data["sweep_dir"])

    @property
    def sweep_id(self) -> str:
        return str(self.data["sweep_id"])

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for rec in self.points:
            found[rec.state] = found.get(rec.state, 0) + 1
        return found

    def active(self) -> bool:
        return any(_is_open(r) for r in self.points)


def _is_open(rec: RunRecord) -> bool:
    return rec.state in ("CREATED", "PENDING") or states.is_active(states.parse(rec.state))


def load(sweep_dir: Path) -> Sweep:
    data = record.load(sweep_dir)
    points = [records.load(record.point_dir(sweep_dir, p["index"])) for p in data["points"]]
    return Sweep(data, points)


def refresh(sweep_dir: Path) -> Sweep:
    return refresh_all([sweep_dir])[0]


def refresh_all(sweep_dirs: Sequence[Path]) -> list[Sweep]:
    """Several sweeps (all of a user's, for `hpclaunch runs`) in the same one squeue and
    at most one sacct call."""
    sweeps = [load(d) for d in sweep_dirs]
    every = [r for s in sweeps for r in s.points]
    local = [r for r in every if r.backend == "local"]
    learnt: dict[Path, Any] = {}
    if local:
        learnt.update({r.path: r for r in tracking.refresh(local)})
    open_ = [r for r in every if r.backend == "slurm" and r.job_id and _is_open(r)]
    changes: dict[Path, dict[str, Any]] = {}
    rest = []
    for rec in open_:
        end = record.point_end(rec.path, str(rec.job_id))
        if end is not None:
            changes[rec.path] = _ended(rec, end)
        else:
            rest.append(rec)
    asked: list[str] = []
    if rest:
        changes.update(_ask_slurm(rest, asked))
    for path, change in changes.items():
        learnt[path] = change
    for sweep in sweeps:
        sweep.asked = tuple(asked)
        sweep.points = [_apply(r, learnt[r.path]) if r.path in learnt else r for r in sweep.points]
    return sweeps


def _apply(rec: RunRecord, found: Any) -> RunRecord:
    return found if isinstance(found, RunRecord) else _write(rec, found)


def _ended(rec: RunRecord, end: dict[str, Any]) -> dict[str, Any]:
    """The array script's own point_end event: the point's job.sh ended with this code."""
    rc = end.get("exit_code")
    if rc == 0:
        return {"state": "COMPLETED", "exit_code": 0, "ended_at": end.get("time")}
    code = job_exit_code("FAILED", rec.path / "logs", f"{rc}:0" if isinstance(rc, int) else None)
    return {"state": "FAILED", "exit_code": code, "ended_at": end.get("time")}


def _ask_slurm(rest: Sequence[RunRecord], asked: list[str]) -> dict[Path, dict[str, Any]]:
    keys = {rec.path: _task_key(str(rec.job_id)) for rec in rest}
    array_ids = sorted({k[0] for k in keys.values()}, key=_numeric)
    found: dict[tuple[str, int], arrays.TaskState] = {}
    try:
        out = slurmcmd.run([*arrays.SQUEUE_ARGV, "-j", ",".join(array_ids)], timeout=30)
        found = arrays.parse_squeue(out)
    except SlurmError:
        pass  # squeue refuses a list of ids it all forgot: accounting answers
    asked.append("squeue")
    missing = [r for r in rest if keys[r.path] not in found]
    if missing:
        # The completion file (sacct -c) knows a task only by its own job id (recorded
        # when the point started, or seen in squeue), a never-started one by its array's.
        known: dict[str, list[tuple[str, int]]] = {}
        for rec in missing:
            own = _own_job_id(rec) or keys[rec.path][0]
            known.setdefault(own, []).append(keys[rec.path])
        ids = sorted({keys[r.path][0] for r in missing} | set(known), key=_numeric)
        found.update(_sacct(ids, known))
        asked.append("sacct")
    learnt: dict[Path, dict[str, Any]] = {}
    for rec in rest:
        task = found.get(keys[rec.path])
        if task is not None:
            learnt[rec.path] = _from_task(rec, task)
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
    ids: Sequence[str], known: dict[str, list[tuple[str, int]]]
) -> dict[tuple[str, int], arrays.TaskState]:
    """One sacct call: the accounting database, else the job completion file."""
    for mode in _SACCT_MODES:
        argv = ["sacct", *mode, "-n", "-P", "-j", ",".join(ids), "-o", arrays.SACCT_FIELDS]
        try:
            return arrays.parse_sacct(slurmcmd.run(argv, timeout=30), known)
        except SlurmError:
            continue
    return {}


def _from_task(rec: RunRecord, task: arrays.TaskState) -> dict[str, Any]:
    state = states.parse(task.state)
    changes: dict[str, Any] = {"state": state.value, "reason": task.reason}
    if task.job_id and task.job_id != task.array_job_id:
        changes["slurm_job_id"] = task.job_id  # what sacct -c will know it by
    if not states.is_active(state) and state != states.State.UNKNOWN:
        end = record.point_end(rec.path, str(rec.job_id))
        if end is not None:  # the point said how it ended (its event beats sacct's word)
            return _ended(rec, end)
        code = None if task.exit_code is None else f"{task.exit_code}:0"
        changes["exit_code"] = job_exit_code(state.value, rec.path / "logs", code)
    return changes


def _write(rec: RunRecord, changes: dict[str, Any]) -> RunRecord:
    if all(getattr(rec, k, rec.extra.get(k)) == v for k, v in changes.items()):
        return rec
    records.update(rec.path, **changes)
    return records.load(rec.path)


def point_row(sweep: Sweep, rec: RunRecord) -> dict[str, Any]:
    """One point as `sweep status --json` prints it."""
    index = int(rec.extra.get("point", 0))
    planned = sweep.data["points"][index]
    return {
        "index": index,
        "params": record.params_of(rec.path, planned.get("params") or {}),
        "args": planned.get("args") or [],
        "state": rec.state,
        "exit_code": rec.exit_code,
        "result": record.result(rec.path),
        "attempts": int(rec.extra.get("attempts", 1)),
        "job": rec.job_id,
    }


def best(rows: Sequence[dict[str, Any]], metric: str, direction: str) -> Optional[dict[str, Any]]:
    """The completed point with the best finite `metric` in its result (lowest index on
    ties); a failed point's metrics are no candidate."""
    scored = []
    for row in rows:
        if row.get("state", "COMPLETED") != "COMPLETED":
            continue
        value = (row.get("result") or {}).get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
            if math.isfinite(number):
                scored.append((number, row["index"], row))
    if not scored:
        return None
    sign = -1.0 if direction == "maximize" else 1.0
    return min(scored, key=lambda s: (sign * s[0], s[1]))[2]
