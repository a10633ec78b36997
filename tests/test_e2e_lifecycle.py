"""A run's life on the testbed: submit without --wait, follow, Ctrl-C detaches (the job
keeps running), cancel, TIMEOUT's exit code, and the run commands from another folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import testbed
from conftest import Hpc

pytestmark = pytest.mark.testbed


def _squeue(hpc: Hpc) -> str:
    return hpc.cmd(["squeue", "-h", "-u", testbed.USER, "-o", "%i %T"]).stdout.strip()


@pytest.mark.serial  # counts all of the user's jobs in squeue; waits for an idle cluster
def test_submit_detach_cancel(hpc: Hpc) -> None:
    proc = hpc.run(
        "run", "-N", "2", "--json", "--", "bash", "-c", 'echo "started $RANK"; sleep 120'
    )
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout)
    job_id = line["job_id"]
    # A second terminal: `logs --follow`, interrupted with Ctrl-C once both ranks printed.
    follow = subprocess.Popen(
        ["runuser", "-u", testbed.USER, "--", "hpclaunch", "logs", job_id, "--follow"],
        cwd=hpc.cwd / "xdg",
        env=hpc.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    ranks_file = hpc.cwd / "runs" / "default" / line["run_id"] / "logs" / "ranks.tsv"
    while time.monotonic() < deadline:
        if ranks_file.exists() and len(ranks_file.read_text().splitlines()) == 2:
            break
        time.sleep(0.5)
    time.sleep(1.5)
    os.killpg(follow.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's process group
    out, _ = follow.communicate(timeout=30)
    assert "] started 0" in out and "] started 1" in out, out
    assert job_id in _squeue(hpc)  # still running: following never cancels

    waiter = subprocess.Popen(
        [
            "runuser",
            "-u",
            testbed.USER,
            "--",
            "hpclaunch",
            "run",
            "-N",
            "1",
            "--wait",
            "--",
            "sleep",
            "120",
        ],
        cwd=hpc.cwd,
        env=hpc.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    # Interrupted once its job is submitted (indexed with a job id): --wait waits on it.
    deadline = time.monotonic() + 60
    while len([r for r in hpc.runs() if r.get("job_id")]) < 2:
        assert time.monotonic() < deadline and waiter.poll() is None, "the job never started"
        time.sleep(0.1)
    time.sleep(0.5)  # from the index line to the wait: a few statements
    os.killpg(waiter.pid, signal.SIGINT)
    _, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 130, err
    assert "detached" in err and "hpclaunch cancel" in err, err
    assert len(_squeue(hpc).splitlines()) == 2  # both jobs still there

    for run in (job_id, "last"):
        cancel = hpc.run("cancel", run)
        assert cancel.returncode == 0, cancel.stderr
    testbed.wait_idle(timeout=60)
    status = hpc.run("status", job_id, "--json")
    record = json.loads(status.stdout)
    assert (record["state"], record["exit_code"]) == ("CANCELLED", 143), record
    listing = hpc.run("runs", "--json").stdout.splitlines()
    assert [json.loads(r)["state"] for r in listing] == ["CANCELLED", "CANCELLED"]


def test_timeout_has_its_own_exit_code(hpc: Hpc) -> None:
    proc = hpc.run("run", "-p", "short", "-t", "1", "--wait", "--", "sleep", "300", timeout=240)
    assert proc.returncode == 124, proc.stderr[-2000:]
    assert "TIMEOUT" in proc.stderr


def test_sigterm_detaches_with_143_and_scancel_records_143(hpc: Hpc) -> None:
    # docs/internals.md "Exit codes of ended runs, by cause", the rows Slurm decides:
    # SIGTERM to `run --wait` detaches (143, as Ctrl-C's 130); scancel ends it CANCELLED 143.
    waiter = subprocess.Popen(
        ["runuser", "-u", testbed.USER, "--", "hpclaunch", "run", "--wait", "--", "sleep", "120"],
        cwd=hpc.cwd, env=hpc.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not [r for r in hpc.runs() if r.get("job_id")]:
        assert time.monotonic() < deadline and waiter.poll() is None, "the job never started"
        time.sleep(0.1)
    time.sleep(0.5)  # from the index line to the wait: a few statements
    # hpclaunch itself, not runuser (which would end its session on SIGTERM).
    [child] = Path(f"/proc/{waiter.pid}/task/{waiter.pid}/children").read_text().split()
    os.kill(int(child), signal.SIGTERM)
    _, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 143 and "detached" in err, err
    [run] = hpc.runs()
    assert hpc.cmd(["scancel", str(run["job_id"])]).returncode == 0
    deadline = time.monotonic() + 60
    while True:
        record = json.loads(hpc.run("status", run["run_id"], "--json").stdout)
        if record["state"] == "CANCELLED" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert (record["state"], record["exit_code"]) == ("CANCELLED", 143), record
