"""--requeue on the real testbed: Slurm's time-limit signal -> the ranks save -> the batch
shell requeues -> the next attempt resumes (tests/programs/count_steps.py).

Real slurmctld/slurmd, real `--signal=B:USR2@S`, `scontrol requeue` and
SLURM_RESTART_COUNT. slurmctld looks at time limits every 30 s and sends
`--signal=B:SIG@S` at the first look that finds at most S + 30 s left, so with `-t 1
--signal-before 20` the signal comes 10 to 40 s after the start (never before the program
has set its handler). The resumable programs are slower on a first attempt (sure to be
signalled) than on a resumed one (tests/programs/count_steps_fast_resume.py: done before
its own signal), so each test takes one requeue and about a minute of the testbed.
What the testbed cannot show: a site's `ProctrackType=proctrack/cgroup` (the testbed uses
linuxproc; both deliver srun's forwarded signal to every process of the step) and
preemption (no preemption here).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

import testbed
from conftest import Hpc, load_json_lines
from test_e2e_staging import _locals_on_nodes

pytestmark = pytest.mark.testbed
PROGRAMS = Path(__file__).parent / "programs"


def _program(hpc: Hpc) -> None:
    shutil.copy(PROGRAMS / "count_steps.py", hpc.cwd / "count_steps.py")
    shutil.copy(PROGRAMS / "count_steps_fast_resume.py", hpc.cwd / "count_steps_fast_resume.py")


# 120 steps of 0.5 s on a first attempt (60 s: more than the 40 s before the signal), 0.02 s
# each once resumed; `-t 1 --signal-before 20`: the signal comes 10 to 40 s in.
STEPS = 120
SIGNAL_SOON = ("-t", "1", "--requeue", "--signal-before", "20")
# For ranks that take long to start (an image unpacked on each node first, as enroot
# does): the signal 45 to 75 s in, after a first attempt of 200 steps (100 s) has begun.
SLOW_START_STEPS = 200
SIGNAL_LATER = ("-t", "2", "--requeue", "--signal-before", "45")


def _record(hpc: Hpc, run_id: str) -> dict[str, Any]:
    proc = hpc.run("status", run_id, "--json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _steps(run_dir: Path, rank: int) -> list[int]:
    lines = (run_dir / "checkpoints" / f"steps-{rank}.log").read_text().splitlines()
    return [int(line.split()[0]) for line in lines]


def _check_resumed(hpc: Hpc, proc: Any, ranks: int, steps: int) -> Path:
    """--wait exited 0 after at least two attempts, every attempt but the last requeued by
    hpclaunch for the time limit, every step done exactly once, each attempt's logs."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = hpc.runs()[-1]["run_id"]
    record = _record(hpc, run_id)
    attempts = record["attempts"]
    assert len(attempts) >= 2, attempts
    for attempt in attempts[:-1]:
        assert attempt["ended"] == "requeued by hpclaunch (time limit)", attempt
    assert attempts[-1]["ended"] == "ended" and attempts[-1]["exit_code"] == 0
    assert record["state"] == "COMPLETED" and record["exit_code"] == 0
    run_dir = Path(record["run_dir"])
    for rank in range(ranks):
        # The step in flight when the signal came is finished, then saved: none repeats.
        assert _steps(run_dir, rank) == list(range(steps)), rank
    for attempt in attempts:
        shown = hpc.run("logs", run_id, "--attempt", str(attempt["number"]), "--rank", "0")
        assert shown.returncode == 0, shown.stderr
        assert f"rank 0 attempt {attempt['number']} resume=" in shown.stdout, shown.stdout
        resumed = "resume=1" if attempt["number"] else "resume=0"
        assert resumed in shown.stdout
    assert "hpclaunch: attempt 1 started" in proc.stderr  # --wait said so
    return run_dir


def test_two_nodes_save_requeue_and_resume(hpc: Hpc) -> None:
    _program(hpc)
    proc = hpc.run(
        "run", "-N", "2", "--tasks-per-node", "2", *SIGNAL_SOON, "--env", f"STEPS={STEPS}",
        "--wait", "--stage", "count_steps.py:CODE",
        "--", "python3", "count_steps_fast_resume.py",
        timeout=600,
    )  # fmt: skip
    run_dir = _check_resumed(hpc, proc, ranks=4, steps=STEPS)
    # Staged again for every attempt (markers per attempt), cleaned after each.
    for attempt in (0, 1):
        marks = sorted(p.name for p in (run_dir / "stage" / f"attempt-{attempt}").iterdir())
        assert marks == ["ready-node1", "ready-node2"], marks
    assert _locals_on_nodes(hpc) == {"node1": [], "node2": []}


def test_ignored_signal_ends_in_timeout_when_the_budget_is_spent(hpc: Hpc) -> None:
    _program(hpc)
    proc = hpc.run(
        "run", *SIGNAL_SOON, "--max-requeues", "1", "--env", "IGNORE=1",
        "--env", "STEPS=100000", "--wait", "--",
        "python3", "count_steps.py",
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 124, proc.stdout + proc.stderr
    run_id = hpc.runs()[-1]["run_id"]
    record = _record(hpc, run_id)
    assert record["state"] == "TIMEOUT"
    attempts = record["attempts"]
    assert len(attempts) == 2, attempts
    assert attempts[0]["ended"] == "requeued by hpclaunch (time limit)"
    status = hpc.run("status", run_id).stdout
    assert "2 attempts" in status and "requeue budget (--max-requeues 1) is spent" in status


def test_cancel_between_attempts_ends_the_run(hpc: Hpc) -> None:
    _program(hpc)
    proc = hpc.run(
        "run", *SIGNAL_SOON, "--json", "--env", "STEPS=100000", "--", "python3", "count_steps.py",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    started = json.loads(proc.stdout)
    run_dir = Path(started["run_dir"])
    deadline = time.monotonic() + 150
    requeued = False
    while time.monotonic() < deadline and not requeued:
        events = (
            load_json_lines(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []
        )
        requeued = any(e.get("reason") == "requeued" for e in events)
        time.sleep(0.5)
    assert requeued, "the first attempt was not requeued"
    queue = ""
    while time.monotonic() < deadline:  # the gap: pending again, before attempt 1 starts
        queue = hpc.cmd(["squeue", "-h", "-j", started["job_id"], "-o", "%T"]).stdout.strip()
        if queue == "PENDING":
            break
        time.sleep(0.2)
    assert queue == "PENDING", queue
    cancelled = hpc.run("cancel", started["run_id"])
    assert cancelled.returncode == 0, cancelled.stderr
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and testbed.jobs_from(hpc.cwd):  # this test's jobs
        time.sleep(0.5)
    assert testbed.jobs_from(hpc.cwd) == []
    record = _record(hpc, started["run_id"])
    assert record["state"] == "CANCELLED", record
    assert [a["number"] for a in record["attempts"]] == [0]
