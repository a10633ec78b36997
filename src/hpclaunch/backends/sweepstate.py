"""A sweep as of now: its record and its points' records, brought up to date together
(runstatus.refresh, as any run: the points' own events, one squeue -r, at most one sacct;
local points from their runner's liveness), and what the status table shows of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpclaunch.backends import runstatus
from hpclaunch.backends.runstatus import is_open
from hpclaunch.basics.states import State
from hpclaunch.records import runrecord, sweeprecord
from hpclaunch.records.runrecord import RunRecord


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
        return any(is_open(r) for r in self.points)


def load(sweep_dir: Path) -> Sweep:
    data = sweeprecord.load(sweep_dir)
    points = [runrecord.load(sweeprecord.point_dir(sweep_dir, p["index"])) for p in data["points"]]
    return Sweep(data, points)


def refresh(sweep_dir: Path) -> Sweep:
    return refresh_all([sweep_dir])[0]


def refresh_all(sweep_dirs: Sequence[Path]) -> list[Sweep]:
    """Several sweeps (all of a user's, for `hpclaunch runs`) in the same one squeue and
    at most one sacct call."""
    sweeps = [load(d) for d in sweep_dirs]
    _bring_up_to_date(sweeps)
    return sweeps


def refresh_open(sweep: Sweep) -> Sweep:
    """`sweep` again, reading and asking about only its points still open: a finished
    point's record is not read again (`sweep wait` over 1,000 points with 990 done reads
    10 records a refresh). A retry (sweep.json's arrays changed) reads them all."""
    data = sweeprecord.load(sweep.sweep_dir)
    if data.get("arrays") != sweep.data.get("arrays"):
        return refresh(sweep.sweep_dir)
    part = Sweep(data, [runrecord.load(r.path) for r in sweep.points if is_open(r)])
    _bring_up_to_date([part])
    fresh = {r.path: r for r in part.points}
    return Sweep(part.data, [fresh.get(r.path, r) for r in sweep.points], part.asked)


def _bring_up_to_date(sweeps: Sequence[Sweep]) -> None:
    """Every point of these sweeps in one runstatus.refresh (one squeue, at most one sacct)."""
    refresh_with_runs(sweeps, ())


def refresh_with_runs(sweeps: Sequence[Sweep], runs: Sequence[RunRecord]) -> list[RunRecord]:
    """These sweeps' points and these plain runs brought up to date together, in one
    runstatus.refresh (`hpclaunch runs`: one squeue and at most one sacct for all of them).
    The sweeps change in place; the runs come back, in their order."""
    asked: list[str] = []
    learnt = runstatus.refresh([*runs, *(r for s in sweeps for r in s.points)], asked=asked)
    at = len(runs)
    for sweep in sweeps:
        sweep.asked = tuple(asked)
        sweep.points, at = learnt[at : at + len(sweep.points)], at + len(sweep.points)
    return learnt[: len(runs)]


def point_row(sweep: Sweep, rec: RunRecord) -> dict[str, Any]:
    """One point as `sweep status --json` prints it."""
    index = int(rec.extra.get("point", 0))
    planned = sweep.data["points"][index]
    return {
        "index": index,
        "params": sweeprecord.params_of(rec.path, planned.get("params") or {}),
        "args": planned.get("args") or [],
        "state": rec.state,
        "exit_code": rec.exit_code,
        "result": sweeprecord.result(rec.path),
        "attempts": int(rec.extra.get("attempts", 1)),
        "job": rec.job_id,
        "reason": rec.reason,  # a packed point's node, slot and GPUs while it runs
    }


def best(rows: Sequence[dict[str, Any]], metric: str, direction: str) -> Optional[dict[str, Any]]:
    """The completed point with the best finite `metric` in its result (lowest index on
    ties); a failed point's metrics are no candidate."""
    scored = []
    for row in rows:
        if row.get("state", State.COMPLETED) != State.COMPLETED:
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
