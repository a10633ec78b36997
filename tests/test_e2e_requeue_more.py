"""More of `--requeue` on the real testbed (issue 11): inside a Charliecloud container and
under `--launcher torchrun`, a requeued sweep point (grid and Optuna), and Lightning's
own SLURMEnvironment requeue beside hpclaunch's (`--requeue-signal USR1`).

The signal's timing: slurmctld looks at time limits every 30 s and sends `--signal=B:SIG@S`
at the first look that finds at most S + 30 s left, so with `-t 1` the signal comes 30 - S
to 60 - S seconds after the start (10 to 40 s for `--signal-before 20`). The programs here
are slow on a first attempt (it is sure to be signalled) and fast once resumed (it ends
before its own signal), so that each test takes one requeue, not several. Scenarios that
fit side by side (the testbed has 2 nodes x 2 CPUs) run concurrently in one test.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from builders import skip_without
from conftest import PROGRAMS, Hpc, load_json_lines

pytestmark = pytest.mark.testbed

T = TypeVar("T")


def _together(*calls: Callable[[], T]) -> list[T]:
    """Run the calls concurrently (each one waits on its own job); their results in order."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


def _all_of(*checks: Callable[[], None]) -> None:
    """Every check, then one failure naming all that failed (one does not hide another)."""
    failed = []
    for check in checks:
        try:
            check()
        except AssertionError as exc:
            failed.append(str(exc))
    assert not failed, "\n\n".join(failed)


def _copy(hpc: Hpc, *names: str) -> None:
    """The programs into the project folder (a container sees that, not tests/)."""
    for name in names:
        shutil.copy(PROGRAMS / name, hpc.cwd / name)


def _record(hpc: Hpc, run_id: str) -> dict[str, Any]:
    proc = hpc.run("status", run_id, "--json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _run_of(hpc: Hpc, exp: str) -> dict[str, Any]:
    """The one run of experiment `exp` (runs go to <run-root>/<exp>/<run-id>/)."""
    (entry,) = [r for r in hpc.runs() if Path(r["run_dir"]).parent.name == exp]
    return entry


def _steps(path: Path) -> list[int]:
    return [int(line.split()[0]) for line in path.read_text().splitlines()]


# 1. The signal reaches the program inside a Charliecloud container and under torchrun.

# -t 2 with the signal 45 s before the end: the ranks get 30 s (45 less the 15 s margin)
# to save and exit. With -t 1 --signal-before 20 they got 5 s, and torchrun's agent, slow
# to end on a loaded testbed, was killed (exit 137). slurmctld signals at its first
# time-limit check (every 30 s) with at most 45 + 30 s left: 45-75 s in.
STEPS = 160  # 0.5 s each on a first attempt: 80 s, more than the 75 s before the signal


def _resumable_run(hpc: Hpc, exp: str, *options: str) -> Any:
    return hpc.run(
        "run", "--exp", exp, "--tasks-per-node", "2", "-t", "2", "--requeue",
        "--signal-before", "45", "--max-requeues", "5", "--env", f"STEPS={STEPS}",
        *options, "--wait", "--", "python3", "count_steps_fast_resume.py",
        timeout=420,
    )  # fmt: skip


def _check_resumed_run(hpc: Hpc, exp: str, proc: Any) -> None:
    """--wait exited 0 after at least two attempts, every attempt but the last requeued
    by hpclaunch for the time limit after the ranks exited 0 (they saved on the signal:
    nothing had to end them), every step done exactly once by each rank."""
    where = f"{exp}: "
    assert proc.returncode == 0, where + proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "hpclaunch: attempt 1 started" in proc.stderr, where + proc.stderr[-3000:]
    run_id = _run_of(hpc, exp)["run_id"]
    record = _record(hpc, run_id)
    attempts: list[dict[str, Any]] = record["attempts"]
    assert len(attempts) >= 2, (exp, attempts)
    for attempt in attempts[:-1]:
        assert attempt["ended"] == "requeued by hpclaunch (time limit)", (exp, attempt)
        assert attempt["exit_code"] == 0, (exp, attempt)
    assert attempts[-1]["ended"] == "ended" and attempts[-1]["exit_code"] == 0, (exp, attempts)
    assert record["state"] == "COMPLETED" and record["exit_code"] == 0, (exp, record)
    checkpoints = Path(record["run_dir"]) / "checkpoints"
    for rank in (0, 1):
        # The step in flight when the signal came is finished, then saved: none repeats.
        assert _steps(checkpoints / f"steps-{rank}.log") == list(range(STEPS)), (exp, rank)
        for attempt in attempts:
            number = attempt["number"]
            shown = hpc.run("logs", run_id, "--attempt", str(number), "--rank", str(rank))
            assert shown.returncode == 0, (exp, shown.stderr)
            resumed = "resume=1" if number else "resume=0"
            assert f"rank {rank} attempt {number} {resumed}" in shown.stdout, (exp, shown.stdout)
            if number == 0:  # the program itself got SIGUSR2 and saved
                assert f"rank {rank} saved at step" in shown.stdout, (exp, shown.stdout)
                assert "on SIGUSR2" in shown.stdout, (exp, shown.stdout)


def test_signal_reaches_the_program_in_a_container_and_under_torchrun(
    hpc: Hpc, user_image: Path
) -> None:
    """Side by side, one node each: 2 ranks in the Charliecloud image, and torchrun with
    2 workers (its agent ignores the signal; srun's forwarded signal reaches the workers)."""
    _copy(hpc, "count_steps.py", "count_steps_fast_resume.py")
    container = ("--container", str(user_image), "--container-runtime", "charliecloud")
    started = time.monotonic()
    in_image, torchrun = _together(
        lambda: _resumable_run(hpc, "container", *container),
        lambda: _resumable_run(hpc, "torchrun", "--launcher", "torchrun"),
    )
    print(f"both runs done in {time.monotonic() - started:.0f} s")
    _check_resumed_run(hpc, "container", in_image)
    _check_resumed_run(hpc, "torchrun", torchrun)
    # One agent per node: the ranks' step has 1 task, its 2 workers are torchrun's.
    run_dir = Path(_run_of(hpc, "torchrun")["run_dir"])
    assert "--ntasks-per-node=1" in (run_dir / "job.sh").read_text()


# 2. A requeued sweep point requeues only its own array task; its Optuna trial resumes.

LONG = 100  # steps of the long point: 50 s on its first attempt, signalled at 10-40 s
SHORT = 4  # steps of the short one: 2 s, done long before any signal
LONG_POINT = 1  # the long point


def _sweep(hpc: Hpc, exp: str, *args: str) -> tuple[Any, dict[str, Any]]:
    """`sweep --json ... --wait`: the process, and the sweep's first line (id, folder)."""
    proc = hpc.run(
        "sweep", "--json", "--exp", exp, "-t", "1", "--requeue", "--signal-before", "20",
        "--max-requeues", "5", *args,
        timeout=420,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    assert lines, exp + ": " + proc.stderr[-3000:]
    return proc, dict(json.loads(lines[0]))


def _sweep_status(hpc: Hpc, sweep_id: str) -> dict[str, Any]:
    proc = hpc.run("sweep", "status", sweep_id, "--json")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _attempt_events(events: list[dict[str, Any]]) -> list[tuple[str, int, Any]]:
    """(event, attempt, reason) of the point's job.sh attempt_start/attempt_end events."""
    return [
        (e["event"], e["attempt"], e.get("reason"))
        for e in events
        if e["event"] in ("attempt_start", "attempt_end")
    ]


def _check_points(hpc: Hpc, exp: str, proc: Any, line: dict[str, Any]) -> None:
    """Both points COMPLETED; the long one was requeued by hpclaunch once, as its own
    array task (the same job id again), and resumed; the short one ran once; every step
    of the long one done once."""
    short = 1 - LONG_POINT
    assert proc.returncode == 0, exp + ": " + proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep_dir = Path(line["sweep_dir"])
    status = _sweep_status(hpc, line["sweep_id"])
    assert [p["state"] for p in status["points"]] == ["COMPLETED"] * 2, (exp, status)
    events = [load_json_lines(sweep_dir / f"points/{i}/events.jsonl") for i in (0, 1)]
    attempts = [_attempt_events(ev) for ev in events]
    # Only the long point's task was requeued: the short one ran once, as attempt 0.
    once = [("attempt_start", 0, None), ("attempt_end", 0, "ended")]
    assert attempts[short] == once, (exp, events[short])
    assert attempts[LONG_POINT][:3] == [
        ("attempt_start", 0, None),
        ("attempt_end", 0, "requeued"),
        ("attempt_start", 1, None),
    ], (exp, events[LONG_POINT])
    assert attempts[LONG_POINT][-1] == ("attempt_end", attempts[LONG_POINT][-2][1], "ended")
    # The array script's own start per attempt of the task, with the task's own job id.
    starts = [[e for e in ev if e["event"] == "point_start"] for ev in events]
    assert len(starts[short]) == 1 and len(starts[LONG_POINT]) >= 2, (exp, starts)
    jobs = [{e["job_id"] for e in ev} for ev in starts]
    assert len(jobs[LONG_POINT]) == 1 and jobs[0] != jobs[1], (exp, jobs)
    ends = [[e for e in ev if e["event"] == "point_end"] for ev in events]
    assert [len(e) for e in ends] == [1, 1], (exp, ends)  # a requeued attempt never ends
    results = [p["result"] for p in status["points"]]
    assert results[short]["steps"] == SHORT and results[short]["attempt"] == "0", results
    assert results[LONG_POINT]["steps"] == LONG and results[LONG_POINT]["attempt"] != "0"
    # `hpclaunch status SWEEP:I` tells the point's attempts as a run's.
    shown = _record(hpc, f"{line['sweep_id']}:{LONG_POINT}")
    described = [a["ended"] for a in shown["attempts"]]
    assert described[0] == "requeued by hpclaunch (time limit)", (exp, shown)
    assert described[-1] == "ended", (exp, shown)
    point = sweep_dir / f"points/{LONG_POINT}"
    assert _steps(point / "checkpoints/steps.log") == list(range(LONG)), exp
    first = (point / "logs/attempt-0/rank-0.out").read_text()
    assert f"point {LONG_POINT} attempt 0 resume=0" in first, (exp, first)
    assert "on SIGUSR2" in first, (exp, first)  # it saved on the signal
    later = (point / "logs/attempt-1/rank-0.out").read_text()
    assert f"point {LONG_POINT} attempt 1 resume=1" in later, (exp, later)


def _check_trials(line: dict[str, Any]) -> None:
    """Two trials, one per point, both COMPLETE: the requeued point's attempts asked and
    got the same trial, and told it once (the requeued attempt told nothing)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    sweep_dir = Path(line["sweep_dir"])
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(sweep_dir / "optuna.journal")))
    study = optuna.load_study(study_name=line["sweep_id"], storage=storage)
    found = [(t.number, t.state.name, t.user_attrs.get("point")) for t in study.trials]
    trials = {t.user_attrs["point"]: t for t in study.trials}
    assert len(study.trials) == 2 and sorted(trials) == [0, 1], found  # none asked anew
    assert {t.state.name for t in study.trials} == {"COMPLETE"}, found  # resumed, not failed
    requeued = trials[LONG_POINT]
    x = requeued.params["x"]
    assert requeued.value == pytest.approx((x - 2.0) ** 2)
    point = sweep_dir / f"points/{LONG_POINT}"
    assert json.loads((point / "run.json").read_text())["trial"] == requeued.number
    log = (point / "logs/batch.out").read_text()
    asked = [text for text in log.splitlines() if "Optuna trial" in text]
    mine = f"hpclaunch: point {LONG_POINT}: Optuna trial {requeued.number}: {{'x': {x}}}"
    assert len(asked) >= 2 and set(asked) == {mine}, asked
    assert log.count("told Optuna") == 1 and "told Optuna COMPLETE" in log, log


def test_a_requeued_point_requeues_its_own_task_and_resumes_its_trial(hpc: Hpc) -> None:
    """Side by side: a 2-point grid and a 2-trial Optuna sweep (4 array tasks, 1 CPU
    each); in both, one point runs long enough to be signalled and the other does not."""
    pytest.importorskip("optuna")
    _copy(hpc, "resumable_point.py")
    space = hpc.cwd / "space.toml"
    space.write_text('x = {type = "float", low = -5.0, high = 5.0}\n')
    steps = ",".join(str(LONG if i == LONG_POINT else SHORT) for i in (0, 1))
    started = time.monotonic()
    grid_args = ("--grid", f"steps={steps}", "--wait", "--",
                 "python3", "resumable_point.py", "{steps}")  # fmt: skip
    optuna_args = ("--optuna", str(space), "--trials", "2", "--metric", "loss",
                   "--wait", "--", "python3", "resumable_point.py", steps,
                   "--x", "{x}")  # fmt: skip
    (grid, grid_line), (tpe, tpe_line) = _together(
        lambda: _sweep(hpc, "grid", *grid_args), lambda: _sweep(hpc, "optuna", *optuna_args)
    )
    print(f"both sweeps done in {time.monotonic() - started:.0f} s")
    _all_of(
        lambda: _check_points(hpc, "grid", grid, grid_line),
        lambda: _check_points(hpc, "optuna", tpe, tpe_line),
        lambda: _check_trials(tpe_line),
    )


# 3. Lightning's own requeue (SLURMEnvironment, SIGUSR1) beside hpclaunch's.


def _logs(hpc: Hpc, run_id: str, attempt: int) -> str:
    """One attempt's output of every rank, stdout and stderr (Lightning logs to stderr)."""
    shown = hpc.run("logs", run_id, "--attempt", str(attempt))
    return shown.stdout + shown.stderr


def _lightning_run(hpc: Hpc, exp: str, ranks: int) -> Any:
    return hpc.run(
        "run", "--exp", exp, "--tasks-per-node", str(ranks), "-t", "3", "--requeue",
        "--requeue-signal", "USR1", "--signal-before", "90", "--max-requeues", "3",
        "--env", f"DEVICES={ranks}", "--wait", "--", "python", "lightning_requeue.py",
        timeout=420,
    )  # fmt: skip


def _check_lightning(hpc: Hpc, exp: str, proc: Any, ranks: int) -> None:
    assert proc.returncode == 0, (exp, proc.stdout[-3000:] + proc.stderr[-3000:])
    entry = _run_of(hpc, exp)
    record = _record(hpc, entry["run_id"])
    run_dir = Path(record["run_dir"])
    events = load_json_lines(run_dir / "events.jsonl")
    first = _logs(hpc, entry["run_id"], 0)
    second = _logs(hpc, entry["run_id"], 1) if len(record["attempts"]) > 1 else ""
    assert record["state"] == "COMPLETED" and record["exit_code"] == 0, (exp, record)
    attempts = record["attempts"]
    # One signal, one requeue: two attempts, and Slurm counted one restart.
    signals = [e["attempt"] for e in events if e["event"] == "signal"]
    assert signals == [0], (exp, events)
    assert [a["number"] for a in attempts] == [0, 1], (exp, attempts)
    # Lightning requeued first: hpclaunch's batch shell was ended before its own requeue.
    assert attempts[0]["ended"] == "requeued by Slurm", (exp, attempts)
    assert attempts[0]["reason"] == "" and attempts[0]["exit_code"] is None, (exp, attempts)
    assert attempts[1]["ended"] == "ended" and attempts[1]["exit_code"] == 0, (exp, attempts)
    shown = hpc.cmd(["scontrol", "show", "job", str(record["job_id"])]).stdout
    assert "Restarts=1 " in shown, (exp, shown)
    # Lightning saved on the signal and requeued; the second attempt restored that save.
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("hpc_ckpt_*"))
    assert saved == ["hpc_ckpt_1.ckpt"], (exp, saved)
    checkpoint = run_dir / "checkpoints" / "hpc_ckpt_1.ckpt"
    assert first.count(f"Requeued SLURM job: {record['job_id']}") == 1, (exp, first)
    assert "Requeued SLURM job" not in second, (exp, second)
    for rank in range(ranks):
        # Lightning's own handler (hpclaunch left SIGUSR1 at its default for the program).
        mine = f"rank {rank} attempt 0: SIGUSR1 handler _HandlersCompose; restart count 0;"
        assert f"{mine} from step 0; restored None" in first, (exp, first)
        assert f"rank {rank} attempt 0: ended" not in first, (exp, first)  # not at max_steps
        again = f"rank {rank} attempt 1: SIGUSR1 handler _HandlersCompose; restart count 1;"
        assert again in second, (exp, second)
        resumed_at = int(second.split(again)[1].split("from step ")[1].split(";")[0])
        assert 0 < resumed_at < 400, (exp, second)
        assert f"restored {checkpoint}" in second.split(again)[1].splitlines()[0], second
        assert f"rank {rank} attempt 1: ended at step 400" in second, (exp, second)


def test_lightning_requeues_itself_on_usr1_exactly_once(hpc: Hpc) -> None:
    """`--requeue --requeue-signal USR1` with Lightning's SLURMEnvironment(auto_requeue)
    (the default under Slurm), side by side: 1 rank, and 2 ranks in DDP (gloo). hpclaunch's
    batch shell passes SIGUSR1 to the ranks; Lightning saves hpc_ckpt_1.ckpt and rank 0
    runs `scontrol requeue` itself; Slurm ends the attempt (its SIGTERM ends hpclaunch's
    batch shell before its own requeue), so the one signal makes exactly one requeue:
    attempt 0 has no end of its own ("requeued by Slurm"), attempt 1 restores the hpc
    checkpoint and completes. `-t 3 --signal-before 90`: the signal comes 60 to 90 s in,
    well after Lightning's handlers are set (its import alone takes 6 s, DDP's set-up ~12 s
    here; a signal before them would kill the rank) and before the first attempt's 100 s
    of steps end, and the fast second attempt (~17 s alone, over 30 s once in a CI with
    the testbed's cores shared: `-t 2 --signal-before 60` signalled it too) ends before
    its own."""
    skip_without("lightning")
    _copy(hpc, "lightning_requeue.py")
    started = time.monotonic()
    one, ddp = _together(
        lambda: _lightning_run(hpc, "one", 1), lambda: _lightning_run(hpc, "ddp", 2)
    )
    print(f"both runs took {time.monotonic() - started:.0f} s")
    _all_of(
        lambda: _check_lightning(hpc, "one", one, 1),
        lambda: _check_lightning(hpc, "ddp", ddp, 2),
    )
