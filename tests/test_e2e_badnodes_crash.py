"""--spares on the testbed with a node crashed (testbed/crash-node.sh) while the ranks run:
the ranks' step starts again on the spare inside the same job (same job id, no trip
through the queue) with HPCLAUNCH_RESUME=1, and the program resumes from its checkpoint.
--requeue and --chain alone (one crash for both): the next attempt names the crashed
node and the attempts after it exclude it, though it is back in service by then.

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


# Attempt 0 runs until its node crashes; attempt 1 waits for the crashed node to be back
# (GATE), then the requeued run's waits for Slurm's time-limit signal (hpclaunch requeues
# it); every later attempt ends at once.
LATER = """echo "attempt $HPCLAUNCH_ATTEMPT on $SLURMD_NODENAME"
case $HPCLAUNCH_ATTEMPT in
0) exec sleep 600 ;;
1) until [ -e "$GATE" ]; do sleep 0.2; done; [ -z "${HOLD-}" ] || exec sleep 600 ;;
esac"""


def _start(hpc: Hpc, *options: str) -> dict[str, Any]:
    proc = hpc.run(
        "run", "-N", "1", "-t", "1", "--no-watch", "--json", "--env", f"GATE={hpc.cwd / 'back'}",
        *options, "--", "bash", "-c", LATER,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    started: dict[str, Any] = json.loads(proc.stdout)
    return started


def _said(run: dict[str, Any], attempt: int) -> str:
    out = Path(run["run_dir"]) / "logs" / f"attempt-{attempt}" / "rank-0.out"
    return out.read_text() if out.exists() else ""


def _ended(hpc: Hpc, run: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(hpc.run("status", run["run_id"], "--json").stdout)
    return record


@needs_crash
def test_requeue_and_chain_alone_exclude_a_crashed_node_from_later_attempts(hpc: Hpc) -> None:
    with testbed.node_crashes() as nodes:
        requeued = _start(hpc, "--requeue", "--signal-before", "16", "--env", "HOLD=1")
        chain = _start(hpc, "--chain", "3")
        _wait_for("attempt 0 of both", lambda: all(_said(r, 0) for r in (requeued, chain)), 120)
        hosts = {_said(r, 0).split()[-1] for r in (requeued, chain)}
        assert len(hosts) == 1, hosts  # Slurm's first fit: both on the first idle node
        first = hosts.pop()
        nodes.crash(first)  # the batch host of both: no shell left to say what happened
        _wait_for("attempt 1 of both", lambda: all(_said(r, 1) for r in (requeued, chain)), 150)
        nodes.restart(first)  # back in service: only the exclusion keeps attempt 2 off it
        (hpc.cwd / "back").touch()
        done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
        _wait_for(
            "both runs to end",
            lambda: all(_ended(hpc, r)["state"] in done and _said(r, 2) for r in (requeued, chain)),
            180,
        )
        job = hpc.cmd(["scontrol", "show", "job", requeued["job_id"]]).stdout
    for run in (requeued, chain):
        record = _ended(hpc, run)
        batch = (Path(run["run_dir"]) / "logs" / "batch.out").read_text()
        assert record["state"] == "COMPLETED", batch
        where = [a["nodes"] for a in record["attempts"]]
        assert len(where) == 3 and where[0] == first and first not in where[1:], where
        assert record["bad_nodes"][first].startswith("node fault"), record
        assert record["exclude"] == first, record
        assert f"excluded   {first}" in hpc.run("status", run["run_id"]).stdout
    assert f"ExcNodeList={first}" in job, job  # set by hpclaunch's requeue of attempt 1
    chain_batch = (Path(chain["run_dir"]) / "logs" / "batch.out").read_text()
    assert f"(next in the chain) excludes {first}" in chain_batch, chain_batch
