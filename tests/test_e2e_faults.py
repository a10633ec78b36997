"""Faults on the real testbed: a rank SIGKILLed, a node crashed (with and without
--requeue), the `run --wait` client SIGKILLed. After each, no process of the job is left
on any node, no node-local staging folder is left (every job stages a file, so each
node has one while it runs), and the record names the cause.

A node crash is testbed/crash-node.sh (SIGKILL of the node's slurmd and of everything in
its namespaces, its private /tmp gone with them); Slurm notices after SlurmdTimeout
(20 s). Crash tests hold the whole testbed (they wait until it is idle first) and bring
every node back even when they fail (`testbed.node_crashes`). They need the netns layout.

A local run whose hpclaunch is SIGKILLed is covered by
tests/test_local_hardening.py::test_sigkilled_launcher_leaves_nothing_running.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import testbed
from conftest import Hpc
from hpclaunch.basics import states

# serial: crashes and restarts nodes (scripts/test.sh runs these after the others)
pytestmark = [pytest.mark.testbed, pytest.mark.serial]

needs_crash = pytest.mark.skipif(
    testbed.crash_reason() is not None, reason=testbed.crash_reason() or ""
)


@pytest.fixture(autouse=True)
def _cancel_left_jobs(hpc: Hpc) -> Iterator[None]:
    """A test that failed half-way leaves no job for the next one (a passing test has
    none left: then this cancels nothing)."""
    yield
    hpc.cmd(["scancel", "-u", testbed.USER])


def _wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(0.2)


def _start(hpc: Hpc, *args: str) -> subprocess.Popen[str]:
    """`hpclaunch ARGS` as the test user, its own process (no runuser in between), so
    SIGKILL to this PID kills exactly the client."""
    user = pwd.getpwnam(testbed.USER)
    return subprocess.Popen(
        ["hpclaunch", *args], cwd=hpc.cwd, env=hpc.env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        user=user.pw_uid, group=user.pw_gid, extra_groups=[], start_new_session=True,
    )  # fmt: skip


def _reap(client: subprocess.Popen[str]) -> None:
    """SIGKILL the client if it still runs, and reap it: a zombie of the test user
    would count as a process left behind."""
    client.kill()
    client.wait(timeout=30)


def _stage_file(hpc: Hpc) -> str:
    """A small file to --stage: each node of the job then has a node-local folder."""
    path = hpc.cwd / "staged.txt"
    path.write_text("staged\n")
    return str(path)


def _run_dir(hpc: Hpc, client: subprocess.Popen[str]) -> Path:
    """The run's folder once its job id is recorded; fails at once if the client ended."""

    def submitted() -> bool:
        if client.poll() is not None:
            out, err = client.communicate()
            raise AssertionError(f"hpclaunch ended ({client.returncode}) early: {out}{err}")
        runs = hpc.run_dirs()
        record = runs[0] / "run.json" if len(runs) == 1 else None
        return record is not None and record.exists() and bool(_loads(record).get("job_id"))

    _wait_for("the job's submission", submitted, 60)
    return hpc.run_dirs()[0]


def _loads(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _ranks(log_dir: Path, count: int, timeout: float = 120) -> dict[int, tuple[str, int]]:
    """{rank: (node, task pid)} from ranks.tsv once `count` ranks started."""
    table = log_dir / "ranks.tsv"

    def started() -> bool:
        return table.exists() and len(table.read_text().splitlines()) >= count

    _wait_for(f"{count} ranks to start", started, timeout)
    ranks = {}
    for line in table.read_text().splitlines():
        rank, node, _local, pid = line.split("\t")
        ranks[int(rank)] = (node, int(pid))
    return ranks


def _children(pid: int) -> list[int]:
    """The live child processes of `pid` (the node namespaces share the host's PIDs)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _record(hpc: Hpc, run_id: str) -> dict[str, Any]:
    proc = hpc.run("status", run_id, "--json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _status_text(hpc: Hpc, run_id: str) -> str:
    proc = hpc.run("status", run_id)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _squeue(hpc: Hpc) -> str:
    return hpc.cmd(["squeue", "-h", "-u", testbed.USER, "-o", "%i %T %r"]).stdout.strip()


def _assert_nothing_left() -> None:
    """No process of the job on any node (the user's, nor a step daemon), no node-local
    staging folder on any node."""

    def gone() -> bool:
        return not testbed.procs_of_user_on_nodes() and not any(
            testbed.node_procs(n) for n in testbed.NODES
        )

    try:
        _wait_for("the job's processes to end", gone, 60)
    except AssertionError:
        left = testbed.procs_of_user_on_nodes()
        left += [p for n in testbed.NODES for p in testbed.node_procs(n)]
        raise AssertionError(f"processes left: {left}") from None
    folders = {
        n: [f for f in testbed.node_tmp(n) if f.startswith("hpclaunch-")] for n in testbed.NODES
    }
    assert folders == {n: [] for n in testbed.NODES}, folders


def test_a_rank_killed_by_sigkill_fails_the_run_naming_rank_and_signal(hpc: Hpc) -> None:
    client = _start(
        hpc, "run", "-N", "2", "--tasks-per-node", "2", "--stage", _stage_file(hpc),
        "--wait", "--", "sleep", "300",
    )  # fmt: skip
    try:
        run_dir = _run_dir(hpc, client)
        node, task = _ranks(run_dir / "logs", 4)[3]
        _wait_for("rank 3's program", lambda: bool(_children(task)), 30)
        [program] = _children(task)  # the bootstrap's child: `sleep 300` itself
        os.kill(program, signal.SIGKILL)
        out, err = client.communicate(timeout=120)
    finally:
        _reap(client)
    assert client.returncode == 137, out + err
    line = f"rank 3 on {node} failed first (killed by SIGKILL)"
    assert line in err, err
    run_id = run_dir.name
    record = _record(hpc, run_id)
    assert (record["state"], record["exit_code"]) == ("FAILED", 137), record
    assert line in _status_text(hpc, run_id)
    _assert_nothing_left()


@needs_crash
def test_a_crashed_node_ends_the_run_as_node_fail(hpc: Hpc) -> None:
    with testbed.node_crashes() as nodes:
        client = _start(
            hpc, "run", "-N", "2", "--stage", _stage_file(hpc), "--wait", "--", "sleep", "300"
        )
        try:
            run_dir = _run_dir(hpc, client)
            _ranks(run_dir / "logs", 2)
            job_id = _loads(run_dir / "run.json")["job_id"]
            nodes.crash("node2")

            def ended() -> bool:
                # Without --requeue the run must not be queued again (Slurm's JobRequeue=1
                # requeues every batch job after a node failure unless told --no-requeue).
                state = hpc.cmd(["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout.strip()
                assert state != "PENDING", f"Slurm requeued a run without --requeue: {state}"
                return client.poll() is not None

            # SlurmdTimeout (10 s) plus a ping interval or two, then the job's end on node1.
            _wait_for("run --wait to end", ended, 120)
            out, err = client.communicate(timeout=30)
        finally:
            _reap(client)
        assert client.returncode == 122, out + err
        assert "NODE_FAIL" in err, err
        nodes.restart("node2")
    run_id = run_dir.name
    record = _record(hpc, run_id)
    assert (record["state"], record["exit_code"]) == ("NODE_FAIL", 122), record
    text = _status_text(hpc, run_id)
    [summary] = [line for line in text.splitlines() if line.startswith("summary")]
    assert "NODE_FAIL" in summary and "exit code 122" in summary, text
    # The cause is node2, not rank 0 on node1 that Slurm ended because of it.
    assert "node2" in summary and "failed first" not in summary, summary
    _assert_nothing_left()


@needs_crash
def test_a_crashed_node_requeues_a_requeue_run_and_the_next_attempt_completes(
    hpc: Hpc,
) -> None:
    # Attempt 0 runs until its batch host crashes; attempt 1 finishes at once.
    program = 'echo "attempt $HPCLAUNCH_ATTEMPT"; [ "$HPCLAUNCH_ATTEMPT" = 0 ] && exec sleep 300; :'
    with testbed.node_crashes() as nodes:
        client = _start(
            hpc, "run", "-N", "2", "-t", "5", "--requeue", "--stage", _stage_file(hpc),
            "--wait", "--", "bash", "-c", program,
        )  # fmt: skip
        try:
            run_dir = _run_dir(hpc, client)
            _ranks(run_dir / "logs" / "attempt-0", 2)
            job_id = _loads(run_dir / "run.json")["job_id"]
            nodes.crash("node1")  # the batch host: its batch shell dies with it

            def requeued() -> bool:
                state = hpc.cmd(["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout.strip()
                return state == "PENDING"

            _wait_for("Slurm to requeue the job", requeued, 90)
            nodes.restart("node1")
            out, err = client.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"run --wait still waits; squeue: {_squeue(hpc)}") from None
        finally:
            _reap(client)
        assert client.returncode == 0, out + err
        assert "hpclaunch: attempt 1 started" in err, err
    run_id = run_dir.name
    record = _record(hpc, run_id)
    assert (record["state"], record["exit_code"]) == ("COMPLETED", 0), record
    attempts = record["attempts"]
    assert [a["ended"] for a in attempts] == ["requeued by Slurm", "ended"], attempts
    assert attempts[1]["exit_code"] == 0
    text = _status_text(hpc, run_id)
    assert "attempt 0: job" in text and "requeued by Slurm" in text, text
    shown = hpc.run("logs", run_id, "--attempt", "1")
    assert "attempt 1" in shown.stdout, shown.stdout + shown.stderr
    _assert_nothing_left()


def test_a_sigkilled_wait_client_leaves_the_job_running_and_status_true(hpc: Hpc) -> None:
    release = hpc.cwd / "release"  # the ranks end once it exists (shared folder)
    program = f"until [ -e {release} ]; do sleep 0.2; done; echo released"
    client = _start(
        hpc, "run", "-N", "2", "--stage", _stage_file(hpc), "--wait", "--",
        "bash", "-c", program,
    )  # fmt: skip
    try:
        run_dir = _run_dir(hpc, client)
        _ranks(run_dir / "logs", 2)
    finally:
        client.kill()  # SIGKILL: no handler, no last word
        client.communicate(timeout=30)
    assert client.returncode == -signal.SIGKILL
    run_id = run_dir.name
    record = _record(hpc, run_id)
    assert record["state"] == "RUNNING", record
    assert "RUNNING" in _status_text(hpc, run_id)
    [listed] = [json.loads(line) for line in hpc.run("runs", "--json").stdout.splitlines()]
    assert listed["state"] == "RUNNING", listed
    release.write_text("")

    def ended() -> bool:
        return not states.is_active(_record(hpc, run_id)["state"])

    _wait_for("status to see the job end", ended, 90)
    record = _record(hpc, run_id)
    assert (record["state"], record["exit_code"]) == ("COMPLETED", 0), record
    assert _loads(run_dir / "run.json")["state"] == "COMPLETED"
    [listed] = [json.loads(line) for line in hpc.run("runs", "--json").stdout.splitlines()]
    assert listed["state"] == "COMPLETED", listed
    _assert_nothing_left()
