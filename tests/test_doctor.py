"""hpclaunch doctor without a cluster: the checks it derives from what sinfo, the nodes
and the ranks report, the table, and the probe run as a process here. On the testbed:
tests/test_e2e_doctor.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from builders import bare_local_env
from conftest import REPO, VENV_BIN
from hpclaunch import node
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profiles import load_profile
from hpclaunch.doctor import checks as doctor
from hpclaunch.doctor import probejob
from hpclaunch.doctor.checks import FAIL, PASS, WARN, Check, NodeInfo

PROBE = node.path("doctor_probe.py")


def _spec(**fields: Any) -> JobSpec:
    return JobSpec(cluster="slurm", program=("python3",), **fields)


def test_too_few_usable_nodes_fail_before_submitting_naming_them() -> None:
    nodes = [NodeInfo("node1", "idle", 2), NodeInfo("node2", "drained", 2)]
    check = doctor._nodes_check(nodes, 2, "partition debug")
    assert check.status == FAIL and "node2 (drained)" in check.detail, check
    assert "node2" in check.fix and "-N" in check.fix, check
    assert doctor._nodes_check(nodes, 1, "partition debug").status == WARN
    assert doctor._nodes_check(nodes[:1], 1, "partition debug").status == PASS


def test_a_profile_claiming_more_gpus_than_the_nodes_have_names_both() -> None:
    profile = load_profile("slurm")
    profile = profile.model_copy(update={"node": profile.node.model_copy(update={"gpus": 8})})
    nodes = [NodeInfo("node1", "idle", 2), NodeInfo("node2", "mixed", 2)]
    check, ask = doctor._gpus_check(nodes, _spec(), profile)
    assert check is not None and check.status == FAIL, check
    assert "says 8 per node" in check.detail and "have 2" in check.detail, check
    assert ask == 2  # the job asks for what is there, and checks the rest
    check, ask = doctor._gpus_check(nodes, _spec(), load_profile("slurm"))
    assert check is not None and check.status == PASS and ask == 2, check


def test_table_puts_the_fix_under_a_failed_check() -> None:
    lines = doctor.table(
        [Check("nodes", PASS, "2 of 2"), Check("binds", FAIL, "missing: /x on node2", "Fix it")]
    )
    assert lines == [
        "PASS  nodes  2 of 2",
        "FAIL  binds  missing: /x on node2",
        "             fix: Fix it",
    ]
    assert doctor.failed([Check("a", WARN, "")]) is False


def test_cpu_masks_as_srun_gets_them() -> None:
    masks = probejob.expected_cpus("verbose,mask_cpu:0x3,0xc0")
    assert masks == [{0, 1}, {6, 7}]
    assert probejob.expected_cpus("map_cpu:1,9") == [{1}, {9}]
    assert probejob.expected_cpus("") == [] and probejob.expected_cpus("none") == []
    assert probejob._cpus({0, 1, 2, 3, 8}) == "0-3,8"


def _rank(rank: int, node_: str, affinity: list[int], **extra: Any) -> dict[str, Any]:
    data = {
        "rank": rank, "local_rank": rank % 2, "node": node_, "affinity": affinity,
        "gpus": {"CUDA_VISIBLE_DEVICES": "0,1"}, "tool": None, "container": "",
        "plugin": [], "rendezvous": {"ok": True, "address": "node1:20001"}, "allreduce": None,
    }  # fmt: skip
    data.update(extra)
    return data


def test_cpu_binding_against_the_profiles_masks() -> None:
    spec = _spec(cpu_bind="mask_cpu:0x3,0xc", cpus_per_task=2, tasks_per_node=2)
    good = [_rank(0, "n1", [0, 1]), _rank(1, "n1", [2, 3])]
    assert probejob.cpu_checks(good, spec)[0].status == PASS
    bad = [_rank(0, "n1", [0, 1]), _rank(1, "n1", [0, 1, 2, 3])]
    check = probejob.cpu_checks(bad, spec)[0]
    assert check.status == FAIL and "rank 1 on n1: 0-3" in check.detail, check


def test_gpus_visible_per_node_against_those_asked() -> None:
    ranks = [_rank(0, "n1", [0]), _rank(1, "n2", [0], gpus={"CUDA_VISIBLE_DEVICES": "0"})]
    check = probejob.gpu_checks(ranks, [], 2)[0]
    assert check.status == FAIL and "n2: 1" in check.detail, check
    assert probejob.gpu_checks(ranks[:1], [], 2)[0].status == PASS
    assert probejob.gpu_checks(ranks, [], 0) == []


def test_rendezvous_allreduce_and_plugin_findings() -> None:
    spec = _spec(container=None)
    broken = _rank(1, "n2", [0], rendezvous={"ok": False, "address": "n1:1", "error": "refused"})
    measured = {"ok": True, "backend": "gloo", "world": 2, "mib": 64, "seconds": 0.5,
                "bus_gbps": 0.13}  # fmt: skip
    checks = {c.name: c for c in probejob.rank_checks(
        [_rank(0, "n1", [0], allreduce=measured), broken], spec, "")}  # fmt: skip
    assert (
        checks["rendezvous"].status == FAIL
        and "rank 1 on n2: refused" in checks["rendezvous"].detail
    )
    assert checks["all-reduce"].status == PASS and "gloo, 2 ranks" in checks["all-reduce"].detail
    none = probejob.rank_checks([_rank(0, "n1", [0])], spec, "")
    assert {c.name: c.status for c in none}["all-reduce"] == WARN


def test_node_checks_name_a_missing_bind_and_its_node() -> None:
    nodes = [
        {"node": "n1", "binds": {"/opt/x": True}, "local": "/tmp", "local_free_bytes": 5 << 30},
        {"node": "n2", "binds": {"/opt/x": False}, "local": "/tmp", "local_free_bytes": 5 << 30},
    ]
    checks = {c.name: c for c in probejob.node_checks(nodes, 2, "")}
    assert checks["srun --overlap"].status == PASS
    assert checks["binds"].status == FAIL and "/opt/x on n2" in checks["binds"].detail
    assert checks["node-local space"].status == PASS
    failed = probejob.node_checks(nodes[:1], 2, "srun: error: overlap not allowed\n")
    assert failed[0].status == FAIL and "overlap not allowed" in failed[0].detail


def test_the_probe_runs_here_as_node_and_as_a_lone_rank(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "SLURMD_NODENAME": "here", "RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"}  # fmt: skip
    args = ["node", "--out", str(out), "--bind", str(tmp_path), "--bind", "/nonexistent/x"]
    subprocess.run([sys.executable, "-I", "-S", str(PROBE), *args], env=env, check=True)
    data = json.loads((out / "node-here.json").read_text())
    assert data["binds"] == {str(tmp_path): True, "/nonexistent/x": False}, data
    subprocess.run(
        [sys.executable, "-I", "-S", str(PROBE), "rank", "--out", str(out)], env=env, check=True
    )
    rank = json.loads((out / "rank-0.json").read_text())
    assert rank["affinity"] == sorted(os.sched_getaffinity(0)) and rank["container"] == ""
    assert rank["rendezvous"]["ok"] is True, rank


@pytest.mark.parametrize("bad", ["0", "-1"])
def test_the_cli_refuses_bad_node_counts_in_one_line(bad: str, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "hpclaunch", "doctor", "--cluster", "local", "-N", bad]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("hpclaunch: error: --nodes:"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_container_and_network_plugin_findings() -> None:
    from types import SimpleNamespace
    from typing import cast

    spec = _spec(container=cast(Any, SimpleNamespace(image="/img/pytorch.sif")))
    plugin = "/opt/aws-ofi-rccl/lib/librccl-net.so"
    inside = [_rank(r, "n1", [r], container="apptainer", plugin=[plugin]) for r in (0, 1)]
    checks = {c.name: c for c in probejob.rank_checks(inside, spec, "librccl-net")}
    assert checks["container"].status == PASS and checks["network plugin"].detail == plugin
    lacking = [_rank(0, "n1", [0], container="apptainer"), _rank(1, "n2", [1])]
    checks = {c.name: c for c in probejob.rank_checks(lacking, spec, "librccl-net")}
    assert (
        checks["container"].status == FAIL and "ranks 1 ran outside" in checks["container"].detail
    )
    assert checks["network plugin"].status == FAIL and "librccl-net" in checks["network plugin"].fix


def test_a_pass_has_no_fix_in_json() -> None:
    assert Check("x", PASS, "fine", "Do something").to_dict()["fix"] == ""
    assert Check("x", WARN, "meh", "Do something").to_dict()["fix"] == "Do something"
    nodes = [{"node": "vm", "binds": {}, "local": "/tmp", "local_free_bytes": 5 << 30}]
    space = {c.name: c for c in probejob.node_checks(nodes, 1, "")}["node-local space"]
    assert (space.status, space.to_dict()["fix"]) == (PASS, "")


def test_local_ranks_that_oversubscribe_the_cores_warn() -> None:
    spec = _spec(nodes=2, tasks_per_node=2, cpus_per_task=2)  # 8 CPUs
    over = doctor.local_cores(spec, cores=4)
    assert over.status == WARN and "= 8 on 4 core(s) here: oversubscribed" in over.detail
    assert over.fix and doctor.local_cores(spec, cores=8).status == PASS


def test_the_local_doctor_shows_the_real_node_local_path(tmp_path: Path) -> None:
    tmp = tmp_path / "my tmp"  # where Python's tempfile, and so every local run, makes it
    tmp.mkdir()
    # The profile's local_dir would name SLURM_TMPDIR first; a local run never uses it.
    env = {**bare_local_env(tmp_path), "TMPDIR": str(tmp), "SLURM_TMPDIR": str(tmp_path)}
    argv = [str(VENV_BIN / "hpclaunch"), "doctor", "--cluster", "local", "-N", "1", "--json"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    found = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert found["node-local space"]["detail"].endswith(f"at {tmp}/hpclaunch-local-JOB-pPID.*")
    assert found["CPU cores"]["status"] in (PASS, WARN)
    assert all(c["fix"] == "" for c in found.values() if c["status"] == PASS), found


GPU_DOUBLES = REPO / "tests" / "doubles" / "gpu"


def test_the_local_doctor_checks_the_gpus_this_machine_has(tmp_path: Path) -> None:
    """On a workstation with GPUs (the stand-in nvidia-smi lists 2), the local doctor's
    job asks for them, and the GPUs its rank sees are checked (on a real H200 it said
    nothing of the GPU: scripts/gpu_check.sh, docs/gpu.md)."""
    pattern = tmp_path / "gpus.json"
    pattern.write_text(json.dumps({"gpus": [{"samples": [[0, 1000, 90.0]]}] * 2}))
    env = {
        **bare_local_env(tmp_path),
        "PATH": f"{GPU_DOUBLES}:{bare_local_env(tmp_path)['PATH']}",
        "HPCLAUNCH_FAKE_GPU_PATTERN": str(pattern),
    }
    argv = [str(VENV_BIN / "hpclaunch"), "doctor", "--cluster", "local", "-N", "1", "--json"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    found = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert found["GPUs here"]["status"] == PASS and found["GPUs here"]["detail"].startswith("2 ")
    visible = found["GPUs visible"]
    assert visible["status"] == PASS and visible["detail"].startswith("2 per node"), visible
