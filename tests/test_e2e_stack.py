"""`hpclaunch stack` on the testbed: a 2x2 job where rank 1 blocks in `stuck_here` and
the others in `waiting_for_data`, on the nodes and inside a Charliecloud image (and the
Apptainer double, which runs ch-run); pending and finished runs are refused."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

import testbed
from conftest import PROGRAMS, REPO, Hpc

pytestmark = pytest.mark.testbed

DOUBLES = REPO / "tests" / "doubles"


@pytest.fixture(autouse=True)
def _pyspy() -> None:
    if not (REPO / ".venv" / "bin" / "py-spy").exists():
        pytest.skip("py-spy is not installed in .venv: pip install -e '.[test]'")


def _start(hpc: Hpc, *options: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """A 2x2 job of tests/programs/stuck_rank.py, detached; back once every rank is in
    its function (printed `ready`), with the rank logs' text as "logs"."""
    shutil.copy(PROGRAMS / "stuck_rank.py", hpc.cwd / "stuck_rank.py")
    proc = hpc.run(
        "run", "-N", "2", "--tasks-per-node", "2", "--json", *options,
        "--", "python3", "stuck_rank.py", "150",
        env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    started: dict[str, Any] = json.loads(proc.stdout)
    logs = hpc.cwd / "runs" / "default" / started["run_id"] / "logs"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ready = [p for p in logs.glob("rank-*.out") if "ready" in p.read_text()]
        if len(ready) == 4:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the ranks never got ready: {list(logs.glob('*'))}")
    time.sleep(0.5)  # from the print to the sleep on the next line
    started["logs"] = "".join(p.read_text() for p in sorted(logs.glob("rank-*.out")))
    return started


def _check_groups(hpc: Hpc, job_id: str) -> None:
    proc = hpc.run("stack", job_id)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert "2 distinct stacks" in text, text
    blocks = text.split("\n\n")[1:]
    stuck = [b for b in blocks if "stuck_here" in b]
    others = [b for b in blocks if "waiting_for_data" in b]
    assert len(stuck) == 1 and stuck[0].startswith("rank 1 ("), text
    assert len(others) == 1 and others[0].startswith("ranks 0,2-3 ("), text
    assert "node1" in others[0] and "node2" in others[0], text

    data = json.loads(hpc.run("stack", job_id, "--json").stdout)
    groups = {tuple(g["ranks"]): g for g in data["groups"]}
    assert set(groups) == {(1,), (0, 2, 3)}, data
    top = [g["threads"][0]["frames"][0]["function"] for g in (groups[(1,)], groups[(0, 2, 3)])]
    assert top == ["stuck_here", "waiting_for_data"], data
    assert data["missing_pyspy"] == [] and data["ended"] == {}, data

    one = hpc.run("stack", job_id, "--rank", "2")
    assert one.returncode == 0 and "rank 2 (node2):" in one.stdout, one.stdout + one.stderr
    assert "waiting_for_data" in one.stdout and "stuck_here" not in one.stdout, one.stdout


def test_stack_groups_the_ranks_of_a_running_job(hpc: Hpc) -> None:
    started = _start(hpc)
    assert started["logs"].count(" host\n") == 4, started["logs"]
    try:
        _check_groups(hpc, started["job_id"])
    finally:
        hpc.run("cancel", started["job_id"])
    testbed.wait_jobs_gone(hpc.cwd, timeout=60)  # its own job; others' may run beside it
    ended = hpc.run("stack", started["job_id"])
    assert ended.returncode == 2, ended.stdout + ended.stderr
    assert ended.stderr.startswith("hpclaunch: error: RUN: ") and "has ended" in ended.stderr
    assert len(ended.stderr.splitlines()) == 1 and "Traceback" not in ended.stderr


def test_stack_of_a_pending_run_is_refused(hpc: Hpc) -> None:
    proc = hpc.run("run", "--json", "--sbatch-arg=--begin=now+1hour", "--", "true")
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads(proc.stdout)["job_id"]
    try:
        refused = hpc.run("stack", job_id)
    finally:
        hpc.run("cancel", job_id)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "is PENDING" in refused.stderr and len(refused.stderr.splitlines()) == 1


@pytest.mark.parametrize("runtime", ["charliecloud", "apptainer"])
def test_stack_inside_a_container(hpc: Hpc, user_image: Path, runtime: str) -> None:
    env = {"PATH": f"{DOUBLES}:{hpc.env['PATH']}"} if runtime == "apptainer" else None
    started = _start(hpc, "--container", str(user_image), "--container-runtime", runtime, env=env)
    assert started["logs"].count(" image\n") == 4, started["logs"]  # the ranks run in it
    try:
        _check_groups(hpc, started["job_id"])
    finally:
        hpc.run("cancel", started["job_id"])


def test_stack_sees_through_a_profiled_rank(hpc: Hpc) -> None:
    """Rank 1 runs under py-spy record (--profile-ranks): its stack is still the
    program's, not the profiler's or the bootstrap's copy between them."""
    started = _start(hpc, "--profile-ranks", "1", "--profiler", "py-spy")
    try:
        _check_groups(hpc, started["job_id"])
    finally:
        hpc.run("cancel", started["job_id"])
