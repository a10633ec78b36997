"""--preflight and --spares on the testbed's two nodes, without crashing one: a node whose
fake GPU is unusable (the nvidia-smi stand-in, tests/doubles/gpu, lists none there) fails
the preflight, is named in the record, and the ranks run on the good node; with no
spare left the job fails naming it. The crash tests (a node lost while the ranks run)
are in tests/test_e2e_badnodes_crash.py, marked serial.

What it cannot show: real GPUs (a GPU that hangs, Xid errors), a node-local disk that is
full, and the all-reduce among more than two nodes (docs/scale.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, Hpc

pytestmark = pytest.mark.testbed

DOUBLES = REPO / "tests" / "doubles" / "gpu"
GPU = {"samples": [[95, 40000, 600.0]]}


def _pattern(hpc: Hpc, unusable: str) -> Path:
    """Every node shows one GPU, except `unusable`, where nvidia-smi lists none."""
    path = hpc.cwd / "gpus.json"
    path.write_text(json.dumps({"gpus": [GPU], "nodes": {unusable: []}}))
    return path


def _submit(hpc: Hpc, *options: str) -> dict[str, Any]:
    proc = hpc.run(
        "run", "--tasks-per-node", "1", "--gpus-per-node", "1", "--no-watch", "--json",
        "--setup", f"export PATH={DOUBLES}:$PATH", *options,
        "--", "python3", "-c", "import socket; print('trained on', socket.gethostname())",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    started: dict[str, Any] = json.loads(proc.stdout)
    return started


def _finished(hpc: Hpc, run_id: str, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    hpc.run("logs", run_id, "--follow", timeout=timeout)
    while time.monotonic() < deadline:
        record: dict[str, Any] = json.loads(hpc.run("status", run_id, "--json").stdout)
        if record["state"] not in ("CREATED", "PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return record
        time.sleep(2)
    pytest.fail(f"run {run_id} did not end within {timeout} s")


def test_preflight_keeps_the_ranks_off_a_node_whose_gpu_is_unusable(hpc: Hpc) -> None:
    # The batch host is the allocation's first node (node1); the ranks' first choice
    # with a spare is the other one, node2: its GPU is the unusable one.
    pattern = _pattern(hpc, "node2")
    started = _submit(
        hpc, "-N", "1", "--spares", "1", "--preflight",
        "--env", f"HPCLAUNCH_FAKE_GPU_PATTERN={pattern}",
    )  # fmt: skip
    record = _finished(hpc, started["run_id"])
    batch = (Path(started["run_dir"]) / "logs" / "batch.out").read_text()
    assert record["state"] == "COMPLETED", batch
    assert list(record["bad_nodes"]) == ["node2"], record
    assert "nvidia-smi lists 0 of 1 GPUs" in record["bad_nodes"]["node2"]
    ranks = (Path(started["run_dir"]) / "logs" / "ranks.tsv").read_text().split("\t")
    assert ranks[1] == "node1", ranks
    text = hpc.run("status", started["run_id"]).stdout
    assert "node2" in text and "preflight" in text, text


def test_preflight_without_a_spare_fails_naming_the_node(hpc: Hpc) -> None:
    pattern = _pattern(hpc, "node1")
    started = _submit(
        hpc, "-N", "1", "--preflight", "--nodelist", "node1",
        "--env", f"HPCLAUNCH_FAKE_GPU_PATTERN={pattern}",
    )  # fmt: skip
    record = _finished(hpc, started["run_id"])
    batch = (Path(started["run_dir"]) / "logs" / "batch.out").read_text()
    assert record["state"] == "FAILED", batch
    assert "node(s) node1 cannot run the ranks" in batch, batch
    assert list(record["bad_nodes"]) == ["node1"], record
    assert not (Path(started["run_dir"]) / "logs" / "ranks.tsv").exists()


def test_a_requeued_jobs_next_attempt_excludes_the_node_that_failed(hpc: Hpc) -> None:
    # The first attempt makes its own node's GPU unusable (its --setup line, once), so
    # whichever node Slurm gives it fails the preflight; the next attempt must run on the
    # other one, which Slurm only does when the job excludes the first.
    pattern, marker = hpc.cwd / "gpus.json", hpc.cwd / "made-bad"
    bad_here = (
        f'[ -e {marker} ] || {{ printf \'{{"gpus": [{json.dumps(GPU)}], '
        f'"nodes": {{"%s": []}}}}\' "$SLURMD_NODENAME" >{pattern}; : >{marker}; }}'
    )
    started = _submit(
        hpc, "-N", "1", "--preflight", "--requeue", "-t", "5:00", "--setup", bad_here,
        "--env", f"HPCLAUNCH_FAKE_GPU_PATTERN={pattern}",
    )  # fmt: skip
    record = _finished(hpc, started["run_id"])
    batch = (Path(started["run_dir"]) / "logs" / "batch.out").read_text()
    assert record["state"] == "COMPLETED", batch
    first, second = record["attempts"]
    assert first["ended"] == "requeued by hpclaunch (bad nodes excluded)", record["attempts"]
    assert first["nodes"] != second["nodes"], record["attempts"]
    assert record["exclude"] == first["nodes"], record
    assert list(record["bad_nodes"]) == [first["nodes"]], record
    text = hpc.run("status", started["run_id"]).stdout
    assert f"excluded   {first['nodes']}" in text, text


def test_with_a_spare_the_ranks_start_off_the_batch_host(hpc: Hpc) -> None:
    started = _submit(hpc, "-N", "1", "--spares", "1", "--setup", 'echo "host $SLURMD_NODENAME"')
    record = _finished(hpc, started["run_id"])
    batch = (Path(started["run_dir"]) / "logs" / "batch.out").read_text()
    assert record["state"] == "COMPLETED", batch
    [host] = [line.split()[1] for line in batch.splitlines() if line.startswith("host ")]
    ranks = (Path(started["run_dir"]) / "logs" / "ranks.tsv").read_text().split("\t")
    assert ranks[1] != host, (host, ranks)
    assert "bad_nodes" not in record and "step_restarts" not in record


def test_preflight_starts_the_container_on_every_node(hpc: Hpc, user_image: Path) -> None:
    proc = hpc.run(
        "run", "-N", "2", "--preflight", "--json", "--container", str(user_image),
        "--container-runtime", "charliecloud", "--", "python3", "-c", "print('trained')",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    started = json.loads(proc.stdout)
    record = _finished(hpc, started["run_id"])
    batch = (Path(started["run_dir"]) / "logs" / "batch.out").read_text()
    assert record["state"] == "COMPLETED", batch
    assert "bad_nodes" not in record, record
    checks = Path(started["run_dir"]) / "preflight" / "attempt-0"
    found = {p.name: json.loads(p.read_text()) for p in checks.glob("node*.json")}
    assert sorted(found) == ["node1.json", "node2.json"], found
    assert all(r["ok"] for r in found.values()), found
