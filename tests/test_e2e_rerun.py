"""`rerun RUN -N 2` on the testbed: Slurm gives the rerun two nodes and its ranks run on
both, with the recorded program (the logic: tests/test_rerun_changes.py)."""

from __future__ import annotations

import json

import pytest

from conftest import Hpc

pytestmark = pytest.mark.testbed

PROGRAM = ["sh", "-c", 'echo "host=$(hostname) world=$WORLD_SIZE nodes=$SLURM_JOB_NUM_NODES"']


def test_a_rerun_with_two_nodes_runs_on_both(hpc: Hpc) -> None:
    first = hpc.run("run", "--wait", "-N", "1", "--", *PROGRAM)
    assert first.returncode == 0, first.stderr
    assert "world=1 nodes=1" in first.stdout
    again = hpc.run("rerun", "last", "--wait", "-N", "2")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("world=2 nodes=2") == 2, again.stdout
    hosts = {part for part in again.stdout.split() if part.startswith("host=")}
    assert hosts == {"host=node1", "host=node2"}, again.stdout
    records = [json.loads((d / "run.json").read_text()) for d in hpc.run_dirs()]
    assert [r["command"] for r in records] == [PROGRAM, PROGRAM]
    assert sorted(r["options"]["nodes"] for r in records) == ["1", "2"]
