"""A sweep as of now: its record and its points' records, brought up to date together
(pointstate.py: the points' own events, one squeue, at most one sacct; local points from
their launcher's liveness), and what the status table shows of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .. import records, tracking
from ..records import RunRecord
from ..states import State
from . import pointstate, record
from .pointstate import is_open


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
    hint = next((s.data.get("sacct_mode") for s in sweeps if s.data.get("sacct_mode")), None)
    asked = pointstate.Asked(sacct_mode=hint)
    learnt.update(pointstate.refresh_points(every, asked))
    for sweep in sweeps:
        sweep.asked = tuple(asked.commands)
        if asked.sacct_mode and sweep.data.get("sacct_mode") != asked.sacct_mode:
            sweep.data = record.update(sweep.sweep_dir, sacct_mode=asked.sacct_mode)
        sweep.points = [learnt.get(r.path, r) for r in sweep.points]
    return sweeps


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
