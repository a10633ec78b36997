"""`sweep --pack` tests that need the testbed to themselves: the scheduler RPCs a pack
costs (sdiag's counters, reset before) and a crash of the non-batch node mid-pack."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import testbed
from conftest import PROGRAMS, Hpc

# serial: resets sdiag's counters / crashes a node (scripts/test.sh runs these alone)
pytestmark = [pytest.mark.testbed, pytest.mark.serial]

PACK_POINT = str(PROGRAMS / "pack_point.py")


def _rpc_counts() -> dict[str, int]:
    """sdiag's count per RPC type (as root, the testbed's SlurmUser)."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, timeout=30, check=True).stdout
    return {
        m[1]: int(m[2]) for m in re.finditer(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)", out, re.M)
    }


def _events(folder: Path) -> list[dict[str, Any]]:
    path = folder / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_pack_of_twelve_points_is_one_sbatch_and_one_step(hpc: Hpc) -> None:
    testbed.wait_idle(timeout=120)
    subprocess.run(["sdiag", "--reset"], check=True, timeout=30)
    out = hpc.folder("out")
    argv = ["--pack", "-N", "2", "--gpus-per-node", "2", "--repeat", "12", "--wait"]
    proc = hpc.run(
        "sweep", "--json", *argv, "--", "python3", PACK_POINT, str(out), "1", timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    counts = _rpc_counts()
    assert counts.get("REQUEST_SUBMIT_BATCH_JOB", 0) == 1
    assert counts.get("REQUEST_JOB_STEP_CREATE", 0) <= 2  # at most one step per node
    assert len(list(out.glob("p*-r0-t1.json"))) == 12


# 2 slots a node: 2 points lost with node2, 2 running on node1 when it crashes, and 2 that
# node1 takes after (its slots go on); 10 points took two more rounds of 12 s.
POINTS = 6


@pytest.mark.skipif(testbed.crash_reason() is not None, reason=testbed.crash_reason() or "")
def test_a_crashed_node_fails_its_points_and_the_other_node_goes_on(hpc: Hpc) -> None:
    out = hpc.folder("out")
    with testbed.node_crashes() as nodes:
        proc = hpc.run("sweep", "--json", "--pack", "-N", "2", "--gpus-per-node", "2", "--repeat",
                       str(POINTS), "--", "python3", PACK_POINT, str(out), "12")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        line = json.loads(proc.stdout.splitlines()[0])
        sweep_dir = Path(line["sweep_dir"])

        def on_node2() -> list[int]:
            return [
                int(p.name)
                for p in sweep_dir.glob("points/*")
                if any(e.get("node") == "node2" for e in _events(p) if e["event"] == "point_start")
            ]

        deadline = time.time() + 120
        while len(on_node2()) < 2:
            assert time.time() < deadline, "no point started on node2"
            time.sleep(0.5)
        lost = on_node2()
        nodes.crash("node2")  # not the batch host (node1)
        waited = hpc.run("sweep", "wait", line["sweep_id"], timeout=400)
        assert waited.returncode != 0
        status = json.loads(hpc.run("sweep", "status", line["sweep_id"], "--json").stdout)
        rows = {p["index"]: p for p in status["points"]}
        for index in lost:
            assert (rows[index]["state"], rows[index]["reason"]) == ("FAILED", "node lost")
        others = [i for i in rows if i not in lost]
        assert all(rows[i]["state"] == "COMPLETED" for i in others)  # node1's slots went on
        nodes.restart("node2")
        retry = hpc.run("sweep", "retry", line["sweep_id"])
        assert retry.returncode == 0, retry.stdout + retry.stderr
        hpc.run("sweep", "wait", line["sweep_id"], timeout=400)
    status = json.loads(hpc.run("sweep", "status", line["sweep_id"], "--json").stdout)
    assert [p["state"] for p in status["points"]] == ["COMPLETED"] * POINTS
