"""hpclaunch doctor on the testbed: all PASS on the healthy 2-node cluster (the all-reduce
through the project venv's torch, gloo), and one FAIL each, with nothing left in the
queue, for a drained node, a profile claiming more GPUs than the nodes have, and a
container bind that does not exist on the nodes.

What it cannot show: real GPUs (the testbed's are fake devices: the count is Slurm's),
LUMI's masks and its network plugin (tests/test_doctor.py checks those findings on
recorded probe output), Apptainer (the double runs ch-run)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import testbed
from conftest import REPO, Hpc

# serial: drains a node; waits for an idle cluster (scripts/test.sh runs these after the others)
pytestmark = [pytest.mark.testbed, pytest.mark.serial]

PYTHON = str(REPO / ".venv" / "bin" / "python")


def _doctor(hpc: Hpc, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = hpc.run("doctor", "--json", "--python", PYTHON, *args, timeout=400)
    assert proc.stdout.strip(), proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, data, proc.stderr


def _by_name(data: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in data["checks"]}


def _queue_empty() -> None:
    testbed.wait_idle(timeout=60)


def test_doctor_passes_on_the_healthy_testbed(hpc: Hpc) -> None:
    code, data, _ = _doctor(hpc, "-N", "2")
    checks = _by_name(data)
    assert code == 0 and data["ok"], data
    assert not [c for c in data["checks"] if c["status"] == "FAIL"], data
    for name in ("controller", "nodes", "GPUs per node", "job", "srun --overlap",
                 "GPUs visible", "CPU binding", "rendezvous", "all-reduce"):  # fmt: skip
        assert checks[name]["status"] == "PASS", checks[name]
    assert "node1" in checks["job"]["detail"] and "node2" in checks["job"]["detail"]
    assert checks["all-reduce"]["detail"].startswith("gloo, 4 ranks, 64 MiB: "), checks
    assert checks["GPUs visible"]["detail"].startswith("2 per node"), checks
    # The text form, with the ranks per node a user's runs would use (not the profile's).
    text = hpc.run("doctor", "--python", PYTHON, "-N", "2", "--tasks-per-node", "1", timeout=400)
    assert text.returncode == 0 and text.stdout.startswith("PASS  controller"), text.stdout
    assert "all-reduce        gloo, 2 ranks, 64 MiB: " in text.stdout, text.stdout
    _queue_empty()


def test_a_drained_node_fails_before_anything_is_submitted(hpc: Hpc) -> None:
    subprocess.run(
        ["scontrol", "update", "nodename=node2", "state=drain", "reason=doctor-test"],
        env=testbed.user_env(), check=True, capture_output=True,
    )  # fmt: skip
    try:
        code, data, _ = _doctor(hpc, "-N", "2")
    finally:
        subprocess.run(
            ["scontrol", "update", "nodename=node2", "state=resume"],
            env=testbed.user_env(), check=True, capture_output=True,
        )  # fmt: skip
    nodes = _by_name(data)["nodes"]
    assert code == 1 and nodes["status"] == "FAIL" and "node2 (drained)" in nodes["detail"]
    assert data["submitted"] is False and not (hpc.cwd / "runs").exists(), data
    _queue_empty()


def test_a_profile_claiming_more_gpus_fails_naming_both_numbers(hpc: Hpc) -> None:
    out = subprocess.run(["sinfo", "-h", "-o", "%P"], env=testbed.user_env(), text=True,
                         capture_output=True, check=True).stdout  # fmt: skip
    partition = next(p.rstrip("*") for p in out.split() if p.endswith("*"))
    clusters = hpc.cwd / "config" / "hpclaunch" / "clusters"
    clusters.mkdir(parents=True)
    (clusters / "slurm.toml").write_text(f"[partitions.{partition}]\ngpus = 8\ndefault = true\n")
    subprocess.run(["chown", "-R", f"{testbed.USER}:", str(hpc.cwd / "config")], check=True)
    proc = hpc.run(
        "doctor", "--json", "--python", PYTHON, "-N", "2", "-p", partition,
        env={"XDG_CONFIG_HOME": str(hpc.cwd / "config")}, timeout=400,
    )  # fmt: skip
    data = json.loads(proc.stdout)
    gpus = _by_name(data)["GPUs per node"]
    assert proc.returncode == 1 and gpus["status"] == "FAIL", data
    assert "says 8 per node" in gpus["detail"] and "have 2" in gpus["detail"], gpus
    _queue_empty()


def test_a_missing_bind_fails_naming_it(hpc: Hpc, user_image: Path) -> None:
    clusters = hpc.cwd / "config" / "hpclaunch" / "clusters"
    clusters.mkdir(parents=True)
    (clusters / "slurm.toml").write_text('[[container.binds]]\npath = "/nonexistent/site-lib"\n')
    subprocess.run(["chown", "-R", f"{testbed.USER}:", str(hpc.cwd / "config")], check=True)
    proc = hpc.run(
        "doctor", "--json", "--python", "python3", "-N", "2",
        "--container", str(user_image), "--container-runtime", "charliecloud",
        env={"XDG_CONFIG_HOME": str(hpc.cwd / "config")}, timeout=400,
    )  # fmt: skip
    data = json.loads(proc.stdout)
    binds = _by_name(data).get("binds", {})
    assert proc.returncode == 1 and binds.get("status") == "FAIL", data
    assert "/nonexistent/site-lib on node1" in binds["detail"], binds
    _queue_empty()
