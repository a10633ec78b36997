"""`hpclaunch rm` and `gc` on the testbed: a queued Slurm job's run is refused (its state
comes from squeue), and deleted once Slurm says it has ended (the logic:
tests/test_removal.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import Hpc

pytestmark = pytest.mark.testbed


def test_a_pending_run_is_never_deleted_and_an_ended_one_is(hpc: Hpc) -> None:
    started = hpc.run("run", "--json", "--sbatch-arg=--begin=now+1hour", "--", "true")
    assert started.returncode == 0, started.stderr
    line = json.loads(started.stdout)
    run_dir = Path(line["run_dir"])
    try:
        refused = hpc.run("rm", line["run_id"], "--yes")
        assert refused.returncode == 2 and "PENDING" in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1 and run_dir.is_dir()
        kept = hpc.run("gc", "--older-than", "0s", "--yes", "--json")
        assert json.loads(kept.stdout)["deleted"] == [] and run_dir.is_dir(), kept.stderr
    finally:
        assert hpc.run("cancel", line["run_id"]).returncode == 0
    done = hpc.run("rm", line["run_id"], "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert [d["state"] for d in json.loads(done.stdout)["deleted"]] == ["CANCELLED"]
    assert not run_dir.exists() and hpc.runs() == []
