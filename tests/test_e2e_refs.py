"""What names a sweep's point on the testbed (refs.py): SWEEP:I, the array task id Slurm
shows (ARRAY_TASK), the point's folder; `cancel SWEEP:I` scancels that task alone and
`cancel last` the rest of the newest sweep. The array is held: nothing runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import Hpc

pytestmark = pytest.mark.testbed


def _json(proc: Any) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    return dict(json.JSONDecoder().raw_decode(proc.stdout)[0])  # the first JSON value


def _states(hpc: Hpc, sweep: str) -> list[str]:
    return [p["state"] for p in _json(hpc.run("sweep", "status", sweep, "--json"))["points"]]


def test_points_by_every_name_and_cancelled_one_then_all(hpc: Hpc) -> None:
    assert hpc.run("run", "--wait", "--", "true").returncode == 0  # an older plain run
    line = _json(hpc.run("sweep", "--json", "--grid", "k=1,2,3", "--sbatch-arg=--hold",
                         "--", "sleep", "{k}"))  # fmt: skip
    sweep_id, array = line["sweep_id"], line["job_ids"][0]
    try:
        point_1 = str(Path(line["sweep_dir"]) / "points" / "1")
        for name in (f"{sweep_id}:1", f"{array}_1", f"{array}:1", point_1):
            shown = _json(hpc.run("status", name, "--json"))
            assert shown["run_id"] == f"{sweep_id}:1" and shown["job_id"] == f"{array}_1", name
        cancelled = _json(hpc.run("cancel", f"{array}_1", "--json"))
        assert cancelled == {"cancelled": f"{array}_1", "run_id": f"{sweep_id}:1"}
        assert _states(hpc, sweep_id) == ["PENDING", "CANCELLED", "PENDING"]
        whole = hpc.run("cancel", "last")  # the newest thing started: the sweep, not the run
        assert whole.returncode == 0 and f"cancelled sweep {sweep_id}: 2 open" in whole.stdout
        assert _states(hpc, "last") == ["CANCELLED"] * 3
    finally:  # a failed check leaves no held array behind
        hpc.cmd(["scancel", array])
