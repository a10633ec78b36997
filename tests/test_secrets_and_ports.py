"""Secrets reach the program only through the environment; two jobs sharing nodes whose
job ids are equal modulo the port span still both initialise gloo (MASTER_PORT from the id)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

import testbed
from conftest import PROGRAMS, Hpc
from hpclaunch import node

pytestmark = pytest.mark.testbed


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _cmdlines_holding(needle: bytes) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                data = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if needle in data:
                found.append(data.replace(b"\0", b" ").decode(errors="replace"))
    return found


@pytest.mark.parametrize("how", ["--env", "environment"])
def test_secret_reaches_program_and_nothing_else(hpc: Hpc, how: str) -> None:
    secret = f"wandb-{random.getrandbits(64):016x}"
    digest = hashlib.sha256(secret.encode()).hexdigest()
    args = ["run", "-N", "2", "--tasks-per-node", "1", "--wait"]
    env: dict[str, str] = {}
    if how == "--env":
        args += ["--env", f"WANDB_API_KEY={secret}"]
    else:
        env["WANDB_API_KEY"] = secret
    # The secret sits on hpclaunch's own command line when given with --env (that is the
    # user's typing); what must never hold it are the job's processes on the nodes.
    proc = subprocess.Popen(
        [
            "runuser",
            "-u",
            testbed.USER,
            "--",
            "hpclaunch",
            *args,
            "--",
            "python3",
            str(PROGRAMS / "secret_probe.py"),
            "6",
        ],
        cwd=hpc.cwd,
        env={**hpc.env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen_running = False
    leaked: list[str] = []
    # Until the run ends: in CI's side-by-side phase the job may wait minutes for cores.
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        lines = [c for c in _cmdlines_holding(b"secret_probe.py") if "hpclaunch run" not in c]
        if lines:
            seen_running = True
            leaked += [c for c in _cmdlines_holding(secret.encode()) if "hpclaunch run" not in c]
        time.sleep(0.3)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert seen_running
    assert leaked == []
    assert out.count(f"digest {digest}") == 2, out
    (entry,) = hpc.runs()
    run_dir = Path(entry["run_dir"])
    assert _files_holding(run_dir, secret.encode()) == []
    assert _files_holding(hpc.cwd / "xdg", secret.encode()) == []
    spec = json.loads((run_dir / "spec.json").read_text())
    if how == "--env":
        assert spec["env"]["WANDB_API_KEY"] == "***"


def test_dry_run_masks_secret(hpc: Hpc) -> None:
    proc = hpc.run(
        "run",
        "--dry-run",
        "--env",
        "HF_TOKEN=hf_abcdef",
        "--env",
        "A=visible",
        "--",
        "python3",
        "x.py",
    )
    assert proc.returncode == 0, proc.stderr
    assert "hf_abcdef" not in proc.stdout
    assert "HF_TOKEN=***" in proc.stdout
    assert "export A=visible" in proc.stdout
    assert hpc.run_dirs() == [] and hpc.runs() == []


@pytest.mark.serial  # reconfigures slurmctld (FirstJobId)
def test_jobs_with_ids_equal_mod_the_port_span_share_nodes(hpc: Hpc) -> None:
    """Two jobs at once on the same two nodes (one core each per node), whose job ids are
    equal modulo the port span (node.PORT_SPAN: both get the same MASTER_PORT from their
    id), both initialise gloo on the same master node: the second steps past the port.

    The second is submitted once the first's rank 0 holds its port: the batch script skips
    a port in use on the node, and cannot see one that a job starting at the same moment
    has not bound yet (docs/internals.md, MASTER_PORT)."""
    base = random.randint(200_000, 800_000)
    job_ids = [base, base + node.PORT_SPAN]
    out = hpc.folder("gloo")
    runs = []
    for job_id in job_ids:
        if runs:
            _wait_for_file(out / str(job_ids[0]) / "ready-0")
        sub = hpc.folder(f"gloo/{job_id}")
        with testbed.first_job_id(job_id):
            proc = hpc.run(
                "run",
                "-N",
                "2",
                "--tasks-per-node",
                "1",
                "--json",
                "--",
                "python",
                str(PROGRAMS / "gloo_pair.py"),
                str(sub),
                "20",
            )
        assert proc.returncode == 0, proc.stderr
        line = json.loads(proc.stdout)
        assert line["job_id"] == str(job_id)
        runs.append(line["run_id"])
    for run_id in runs:
        assert _wait_done(hpc, run_id) == "COMPLETED"
    records = {
        job_id: [json.loads(p.read_text()) for p in sorted((out / str(job_id)).glob("*.json"))]
        for job_id in job_ids
    }
    for job_id, recs in records.items():
        assert len(recs) == 2 and all(r["sum"] == 3.0 for r in recs)
        assert {r["job"] for r in recs} == {str(job_id)}
    first, second = records[job_ids[0]], records[job_ids[1]]
    # The same port from the id, and the second stepped past the first's, in use.
    assert int(first[0]["port"]) < int(second[0]["port"]) <= int(first[0]["port"]) + 100
    assert first[0]["addr"] == second[0]["addr"]  # same master node
    # They really overlapped: each was initialised before the other finished.
    assert first[0]["ready"] < second[0]["end"] and second[0]["ready"] < first[0]["end"]


def _wait_for_file(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path} after {timeout:g} s"
        time.sleep(0.2)


def _wait_done(hpc: Hpc, run_id: str, timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = hpc.run("status", run_id, "--json")
        assert proc.returncode == 0, proc.stderr
        state = str(json.loads(proc.stdout)["state"])
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "CREATED"):
            return state
        time.sleep(1)
    raise AssertionError(f"run {run_id} did not end in {timeout} s")
