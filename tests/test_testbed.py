"""The Slurm testbed itself behaves like a small real cluster.

Needs ``testbed/up.sh`` running (and root, to act as the job user); skipped otherwise.
Every job is submitted by the unprivileged user ``hpcuser`` from the shared work folder.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# tests/ is a plain folder (no __init__.py): pytest puts it on sys.path, so the helper
# module tests/testbed.py imports as "testbed" (it wins over the testbed/ script folder).
import testbed as tb

_SKIP = tb.skip_reason()
pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

needs_netns = pytest.mark.skipif(
    tb.layout() != "netns",
    reason=f"testbed runs in the {tb.layout()!r} layout: nodes share hostname and /tmp",
)


@pytest.fixture
def job_dir() -> Iterator[Path]:
    """A fresh folder of hpcuser's in the shared work folder, removed afterwards."""
    path = tb.work_dir() / f"test-{uuid.uuid4().hex[:10]}"
    proc = tb.run_as_user(["mkdir", str(path)], cwd=tb.work_dir())
    assert proc.returncode == 0, proc.stderr
    yield path
    shutil.rmtree(path, ignore_errors=True)


def ok(argv: list[str], cwd: Path, timeout: float = 60) -> str:
    """Run argv as hpcuser, require success, return stdout."""
    proc = tb.run_as_user(argv, cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, f"{argv} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def by_task(srun_l_output: str) -> dict[int, str]:
    """Parse ``srun -l`` output ("  3: text") into {task: text}."""
    result = {}
    for line in srun_l_output.splitlines():
        task, _, text = line.partition(":")
        result[int(task)] = text.strip()
    return result


def test_two_nodes() -> None:
    assert tb.node_names() == ["node1", "node2"]


def test_tasks_spread_over_both_nodes_as_user(job_dir: Path) -> None:
    out = ok(["srun", "-N2", "-n4", "-l", "sh", "-c", 'echo "$SLURMD_NODENAME $(id -un)"'], job_dir)
    tasks = by_task(out)
    assert sorted(tasks) == [0, 1, 2, 3]
    assert {text.split()[0] for text in tasks.values()} == {"node1", "node2"}
    assert {text.split()[1] for text in tasks.values()} == {tb.USER}


@needs_netns
def test_nodes_have_different_hostnames(job_dir: Path) -> None:
    tasks = by_task(ok(["srun", "-N2", "-n4", "-l", "hostname"], job_dir))
    assert sorted(tasks) == [0, 1, 2, 3]
    assert set(tasks.values()) == {"node1", "node2"}


@needs_netns
def test_tmp_is_private_per_node(job_dir: Path) -> None:
    marker = f"/tmp/testbed-{uuid.uuid4().hex}"
    ok(["srun", "-w", "node1", "touch", marker], job_dir)
    try:
        # Still there for a later step on node1 (the node's /tmp lives as long as its slurmd)...
        ok(["srun", "-w", "node1", "test", "-e", marker], job_dir)
        # ...but neither on node2 nor on the host.
        proc = tb.run_as_user(["srun", "-w", "node2", "test", "-e", marker], cwd=job_dir)
        assert proc.returncode != 0, "file written to node1's /tmp is visible on node2"
        assert not Path(marker).exists(), "file written to node1's /tmp is visible on the host"
    finally:
        tb.run_as_user(["srun", "-w", "node1", "rm", "-f", marker], cwd=job_dir)


def test_batch_job_writes_into_shared_folder(job_dir: Path) -> None:
    script = job_dir / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --nodes=2\n"
        "#SBATCH --ntasks-per-node=1\n"
        "#SBATCH --output=out-%j.txt\n"
        'echo "user=$(id -un)"\n'
        'echo "nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr "\\n" " ")"\n'
        "srun -l sh -c 'echo \"node=$SLURMD_NODENAME\"'\n"
        "echo done > result.txt\n"
    )
    shutil.chown(script, tb.USER, tb.USER)
    job_id = ok(["sbatch", "--wait", "--parsable", "job.sh"], job_dir).strip()
    assert job_id.isdigit(), job_id

    out_file = job_dir / f"out-{job_id}.txt"
    out = out_file.read_text()
    assert "user=hpcuser" in out
    assert "nodes=node1 node2" in out
    assert "node=node1" in out and "node=node2" in out
    result = job_dir / "result.txt"
    assert result.read_text() == "done\n"
    for path in (out_file, result):
        assert path.owner() == tb.USER

    # No accounting database: finished jobs are in the jobcomp file that `sacct -c` reads.
    acct = ok(["sacct", "-c", "-n", "-P", "--format=JobID,State,User"], job_dir)
    rows = [line.split("|") for line in acct.splitlines()]
    # The User column reads "hpcuser(1001)".
    assert any(r[:2] == [job_id, "COMPLETED"] and r[2].startswith(f"{tb.USER}(") for r in rows)


def test_fake_gpus(job_dir: Path) -> None:
    tasks = by_task(
        ok(["srun", "-N2", "--gpus-per-node=2", "-l", "printenv", "CUDA_VISIBLE_DEVICES"], job_dir)
    )
    assert tasks == {0: "0,1", 1: "0,1"}
    # Only two per node: more is refused at once (not left pending).
    proc = tb.run_as_user(["srun", "-N1", "--gpus-per-node=3", "true"], cwd=job_dir, timeout=30)
    assert proc.returncode != 0
    assert "Requested node configuration is not available" in proc.stderr


def test_partitions(job_dir: Path) -> None:
    short = ok(["scontrol", "show", "partition", "short"], job_dir)
    assert "MaxTime=00:01:00" in short
    debug = ok(["scontrol", "show", "partition", "debug"], job_dir)
    assert "Default=YES" in debug
    assert "MaxTime=UNLIMITED" in debug


def _wait_for(condition: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {condition}"
        time.sleep(0.2)


@pytest.mark.serial  # counts the user's processes on the nodes
def test_user_processes_on_nodes_are_visible_from_host(job_dir: Path) -> None:
    # A unique sleep length identifies this test's process among any others of hpcuser.
    seconds = f"600.{uuid.uuid4().int % 10**9:09d}"
    job_id = ok(
        ["sbatch", "--parsable", "-w", "node2", "-o", "/dev/null", f"--wrap=exec sleep {seconds}"],
        job_dir,
    ).strip()

    def mine() -> list[str]:
        return [p for p in tb.procs_of_user_on_nodes() if f"sleep {seconds}" in p]

    try:
        _wait_for("the job's sleep to show in ps", lambda: bool(mine()))
        pid = int(mine()[0].split()[0])
        if tb.layout() == "netns":
            # It really runs inside node2 (its network namespace), yet the host sees it.
            assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/run/netns/sl-node2").st_ino
    finally:
        ok(["scancel", job_id], job_dir)
    _wait_for("the cancelled job's process to end", lambda: not mine())


def test_user_can_make_a_venv_in_shared_folder(job_dir: Path) -> None:
    # /usr/bin/python3: hpcuser cannot enter root's home, where pyenv's pythons live.
    ok(["/usr/bin/python3", "-m", "venv", "venv"], job_dir, timeout=120)
    # The shared folder is seen by the nodes: the venv works in a job step there.
    # Side by side with other tests' jobs, the step may queue minutes for node2.
    out = ok(
        ["srun", "-w", "node2", "venv/bin/python", "-c", "import sys; print(sys.prefix)"],
        job_dir,
        timeout=600,
    )
    assert out.strip() == str(job_dir / "venv")
    assert ok(["venv/bin/python", "-m", "pip", "--version"], job_dir).startswith("pip ")


@pytest.mark.serial  # needs an idle cluster
def test_wait_idle_returns_when_nothing_runs() -> None:
    tb.wait_idle(timeout=60)


def test_jobs_from_a_folder_are_only_that_folders_and_waited_for(job_dir: Path) -> None:
    """What a test running beside others waits for at its end (conftest's hpc fixture):
    its own jobs, told apart by the folder they were submitted from, not everyone's."""
    elsewhere = tb.work_dir() / f"test-{uuid.uuid4().hex[:10]}"
    assert tb.run_as_user(["mkdir", str(elsewhere)], cwd=tb.work_dir()).returncode == 0
    sbatch = ["sbatch", "--parsable", "-o", "/dev/null", "--wrap"]
    theirs = ok([*sbatch, "sleep 30"], elsewhere).strip()
    try:
        mine = ok([*sbatch, "sleep 3"], job_dir).strip()
        listed = tb.jobs_from(job_dir)
        assert [line.split()[0] for line in listed] == [mine], listed
        started = time.monotonic()
        tb.wait_jobs_gone(job_dir, timeout=60)  # returns with the other folder's job there
        assert time.monotonic() - started < 30
        assert [line.split()[0] for line in tb.jobs_from(elsewhere)] == [theirs]
    finally:
        tb.run_as_user(["scancel", theirs], cwd=tb.work_dir())
        shutil.rmtree(elsewhere, ignore_errors=True)
