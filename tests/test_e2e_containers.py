"""Container jobs on the real testbed with the real Charliecloud runtime (ch-run 0.31),
and the same jobs through tests/doubles/apptainer.

Apptainer cannot be installed on this machine kind (shared/TESTBED.md), so the
`apptainer` runtime is exercised through a test double that accepts only Apptainer's
documented `exec` grammar and translates it into ch-run (tests/doubles/README.md); the
Apptainer command lines LUMI gets are pinned by tests/test_lumi_container_golden.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import testbed
from conftest import PROGRAMS, REPO, Hpc

pytestmark = pytest.mark.testbed

DOUBLES = REPO / "tests" / "doubles"


def _probe_job(hpc: Hpc, image: Path, runtime: str) -> tuple[list[dict[str, Any]], Path]:
    """2 nodes x 2 tasks in the image; a --bind at the same path and one at a path the
    image does not have; a secret and a host-only variable in the submitting shell."""
    shutil.copy(PROGRAMS / "container_probe.py", hpc.cwd / "probe.py")
    shared = testbed.work_dir() / f"bind-{hpc.cwd.name}"
    shared.mkdir()
    (shared / "data.txt").write_text("from the bind")
    other = hpc.folder("other")
    (other / "file.txt").write_text("mapped")
    out = hpc.folder("out")
    for path in (shared, shared / "data.txt", other / "file.txt"):
        os.chown(path, *_owner(hpc))
    env = {"HOST_ONLY_VARIABLE": "leaks", "WANDB_API_KEY": "s3cr3t-value-42"}
    if runtime == "apptainer":
        env["PATH"] = f"{DOUBLES}:{hpc.env['PATH']}"
    try:
        proc = hpc.run(
            "run", "-N", "2", "--tasks-per-node", "2", "--wait",
            "--container", str(image), "--container-runtime", runtime,
            "--bind", str(shared), "--bind", f"{other}:/hpclaunch-mapped/deeper",
            "--", "python3", "probe.py", str(out), f"{shared}/data.txt",
            "/hpclaunch-mapped/deeper/file.txt",
            env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    reports = sorted(
        (json.loads(p.read_text()) for p in out.glob("probe-*.json")),
        key=lambda r: int(r["env"]["RANK"]),
    )
    return reports, hpc.run_dirs()[-1]


def _owner(hpc: Hpc) -> tuple[int, int]:
    info = hpc.cwd.stat()
    return info.st_uid, info.st_gid


@pytest.mark.parametrize("runtime", ["charliecloud", "apptainer"])
def test_two_nodes_in_a_container_see_the_contract(
    hpc: Hpc, user_image: Path, runtime: str
) -> None:
    reports, run_dir = _probe_job(hpc, user_image, runtime)
    assert len(reports) == 4
    env = [r["env"] for r in reports]
    assert [e["RANK"] for e in env] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in env] == ["0", "1", "0", "1"]
    assert [e["NODE_RANK"] for e in env] == ["0", "0", "1", "1"]
    assert [e["SLURM_PROCID"] for e in env] == ["0", "1", "2", "3"]
    assert {e["WORLD_SIZE"] for e in env} == {"4"}
    assert {e["LOCAL_WORLD_SIZE"] for e in env} == {"2"}
    nodes = [e["SLURMD_NODENAME"] for e in env]
    if testbed.layout() == "netns":
        assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
    assert {e["MASTER_ADDR"] for e in env} == {nodes[0]}
    # Inside the image, with the runtime's environment cleaned.
    assert all(r["image_marker"] for r in reports)
    assert {e["CH_RUNNING"] for e in env} == {"Weird Al Yankovic"}
    assert {e["HOST_ONLY_VARIABLE"] for e in env} == {None}
    assert {e["PYTHONNOUSERSITE"] for e in env} == {"1"}
    assert {e["WANDB_API_KEY"] for e in env} == {"s3cr3t-value-42"}
    assert {r["executable"] for r in reports} == {"/usr/bin/python3"}
    # The TCP exchange over MASTER_ADDR:MASTER_PORT: 0+1+2+3 everywhere.
    assert {r["total"] for r in reports} == {6}
    # Binds: the run directory (written from inside), a folder at its own path, and one
    # at a destination the image did not have.
    assert {r["bind"] for r in reports} == {"from the bind"}
    assert {r["mapped"] for r in reports} == {"mapped"}
    assert {e["HPCLAUNCH_RUN_DIR"] for e in env} == {str(run_dir)}
    assert sorted(p.name for p in run_dir.glob("written-by-*")) == [
        f"written-by-{n}" for n in range(4)
    ]
    assert {r["cwd"] for r in reports} == {str(hpc.cwd)}
    # The secret never reached a command line, a file or the batch script.
    assert {tuple(r["secret_in_cmdlines"]) for r in reports} == {()}
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert b"s3cr3t-value-42" not in path.read_bytes(), path


def test_local_cluster_runs_the_same_container_task(hpc: Hpc, user_image: Path) -> None:
    """--cluster local: the same task line, as local processes."""
    proc = hpc.run(
        "run", "--cluster", "local", "--tasks-per-node", "2", "--container", str(user_image),
        "--container-runtime", "charliecloud", "--", "python3", "-c",
        "import os; print('IN', os.environ['RANK'], os.path.exists('/hpclaunch-test-image'))",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sorted(x.split("IN ")[1] for x in proc.stdout.splitlines() if "IN " in x) == [
        "0 True",
        "1 True",
    ]


def test_dry_run_shows_the_container_command_line(hpc: Hpc, user_image: Path) -> None:
    proc = hpc.run(
        "run", "--dry-run", "--container", str(user_image), "--container-runtime",
        "charliecloud", "--", "python3", "train.py",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("#   ch-run"))
    assert f"--cd={hpc.cwd} --bind={hpc.cwd}:{hpc.cwd} {user_image} -- python3 -I -S" in line
    assert line.endswith("--hpclaunch-env-fd=3 python3 train.py")
    assert hpc.run_dirs() == [] and hpc.runs() == []


def _refused(hpc: Hpc, *args: str) -> str:
    proc = hpc.run("run", *args, "--", "python3", "x.py")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpclaunch: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert hpc.run_dirs() == [] and hpc.runs() == []
    return lines[0]


def test_bad_container_requests_are_refused_before_submission(
    hpc: Hpc, user_image: Path, base_image: Path
) -> None:
    ch = ("--container-runtime", "charliecloud")
    line = _refused(hpc, "--container", str(user_image), *ch, "--bind", "/no/such/folder")
    assert "--bind: /no/such/folder does not exist" in line
    line = _refused(hpc, "--container", str(hpc.cwd / "missing.sif"))
    assert "--container: image" in line and "missing.sif" in line and "not found" in line
    line = _refused(hpc, "--container", str(user_image), "--container-runtime", "docker")
    assert "--container-runtime" in line and "docker" in line
    # A read-only image (root's) where a bind's destination is missing: named, with a way out.
    folder = hpc.folder("data")
    line = _refused(hpc, "--container", str(base_image), *ch, "--bind", f"{folder}:/data/x")
    assert "/data/x" in line and "not in the image" in line and "Bind to a folder" in line
    line = _refused(hpc, "--container", str(user_image), *ch, "--bind", f"{folder}:/d:ro")
    assert "read-only" in line
