"""--spares on the testbed with a node crashed (testbed/crash-node.sh) while the ranks run:
the ranks' step starts again on the spare inside the same job (same job id, no trip
through the queue) with HPCLAUNCH_RESUME=1, and the program resumes from its checkpoint.

Serial (it crashes a node: scripts/test.sh runs it after the others, on an idle
testbed, as tests/test_e2e_faults.py). What it cannot show: a spare among hundreds of
nodes, a node that dies slowly (hung GPU, flapping network), Slurm's own node health
checks (docs/scale.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import testbed
from conftest import Hpc

pytestmark = [pytest.mark.testbed, pytest.mark.serial]

needs_crash = pytest.mark.skipif(
    testbed.crash_reason() is not None, reason=testbed.crash_reason() or ""
)

# Saves step 5 and trains on; resumed (HPCLAUNCH_RESUME=1), reads the step and ends.
PROGRAM = """
import os, pathlib, socket, time
ckpt = pathlib.Path(os.environ["HPCLAUNCH_CHECKPOINT_DIR"]) / "step"
if os.environ.get("HPCLAUNCH_RESUME") == "1" and ckpt.exists():
    print("resumed from step", ckpt.read_text(), "on", socket.gethostname(), flush=True)
else:
    ckpt.write_text("5")
    print("saved step 5 on", socket.gethostname(), flush=True)
    time.sleep(600)
"""


def _wait_for(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(0.5)


@needs_crash
def test_a_crashed_nodes_ranks_restart_on_the_spare_in_the_same_job(hpc: Hpc) -> None:
    with testbed.node_crashes() as nodes:
        proc = hpc.run(
            "run", "-N", "1", "--spares", "1", "-t", "10:00", "--json",
            "--", "python3", "-c", PROGRAM,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        started = json.loads(proc.stdout)
        run_dir = Path(started["run_dir"])
        out = run_dir / "logs" / "rank-0.out"
        _wait_for(
            "rank 0 to save", lambda: "saved" in (out.read_text() if out.exists() else ""), 120
        )
        first = (run_dir / "logs" / "ranks.tsv").read_text().split("\t")[1]
        nodes.crash(first)  # the rank's node, never the batch host with a spare asked
        hpc.run("logs", started["run_id"], "--follow", timeout=300)
        nodes.restart(first)
        _check_the_swap(hpc, started, first)  # before the helper waits for an idle testbed


def _check_the_swap(hpc: Hpc, started: dict[str, Any], first: str) -> None:
    run_dir = Path(started["run_dir"])
    out = run_dir / "logs" / "rank-0.out"
    record: dict[str, Any] = json.loads(hpc.run("status", started["run_id"], "--json").stdout)
    batch = (run_dir / "logs" / "batch.out").read_text()
    assert record["state"] == "COMPLETED", batch
    assert record["job_ids"] in ([], [started["job_id"]]), record  # one job: no requeue
    assert record["job_id"] == started["job_id"]
    events = (run_dir / "events.jsonl").read_text()
    assert record.get("step_restarts"), batch + events + out.read_text()
    [restart] = record["step_restarts"]
    assert restart["lost"] == first, record
    assert record["bad_nodes"][first].startswith("node fault"), record
    text = out.read_text()
    assert "resumed from step 5" in text, text
    assert f"on {first}" not in text.split("resumed", 1)[1], text
    status = hpc.run("status", started["run_id"]).stdout
    assert "restarted in the same job" in status, status
