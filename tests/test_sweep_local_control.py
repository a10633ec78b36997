"""A local sweep (--cluster local) is cancelled, throttled and retried from another
terminal as a Slurm sweep is: its runner, `hpclaunch sweep` in the foreground, learns of
it from the records (no Slurm here: real processes, real signals)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from builders import KEEPS_ON, local_env
from hpclaunch.records import runrecord
from sweeptools import most_at_once
from test_sweep_local import HPCLAUNCH, POINT, _hpclaunch


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [HPCLAUNCH, "sweep", *args], cwd=tmp_path, env=local_env(tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _sweep_dir(tmp_path: Path) -> Path:
    deadline = time.monotonic() + 60
    while True:
        found = list((tmp_path / "runs" / "default").glob("*/sweep.json"))
        if found:
            return found[0].parent
        assert time.monotonic() < deadline, "the sweep folder never appeared"
        time.sleep(0.2)


def _started(sweep_dir: Path, point: int, timeout: float = 60) -> None:
    """Wait until the point's rank 0 runs its program."""
    events = sweep_dir / "points" / str(point) / "events.jsonl"
    deadline = time.monotonic() + timeout
    while not (events.exists() and "rank_start" in events.read_text()):
        assert time.monotonic() < deadline, f"point {point} never started"
        time.sleep(0.1)


def _status(tmp_path: Path) -> dict[str, Any]:
    proc = _hpclaunch(tmp_path, "sweep", "status", "last", "--json")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _ran(sweep_dir: Path, point: int) -> list[dict[str, Any]]:
    events = sweep_dir / "points" / str(point) / "events.jsonl"
    if not events.exists():
        return []
    return [json.loads(line) for line in events.read_text().splitlines()]


def _spans(sweep_dir: Path, points: list[int]) -> list[tuple[float, float]]:
    spans = []
    for point in points:
        times = _ran(sweep_dir, point)
        start = [e["time"] for e in times if e["event"] == "rank_start"]
        end = [e["time"] for e in times if e["event"] == "rank_end"]
        if not end:  # cancelled: its record says when it ended
            record = json.loads((sweep_dir / "points" / str(point) / "run.json").read_text())
            end = [record["ended_at"]]
        spans.append((min(start), max(end)))
    return spans


def test_cancelling_a_local_sweep_stops_the_running_point_and_starts_no_other(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    runner = _start(tmp_path, "--grid", "k=0,1,2", "--max-parallel", "1", "--",
                    sys.executable, POINT, str(out), "--sleep", "300")  # fmt: skip
    try:
        sweep_dir = _sweep_dir(tmp_path)
        _started(sweep_dir, 0)
        began = time.monotonic()
        cancel = _hpclaunch(tmp_path, "sweep", "cancel", "last")
        assert cancel.returncode == 0, cancel.stderr
        runner.wait(timeout=60)  # not 3 x 300 s: nothing runs on
        assert time.monotonic() - began < 30
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 143, runner.stderr
    status = _status(tmp_path)
    assert [p["state"] for p in status["points"]] == ["CANCELLED"] * 3
    assert [p["exit_code"] for p in status["points"]] == [143] * 3
    assert _ran(sweep_dir, 1) == [] and _ran(sweep_dir, 2) == []  # never started
    again = _hpclaunch(tmp_path, "sweep", "cancel", "last")
    assert again.returncode == 0 and "nothing to cancel" in again.stdout


def test_a_local_sweep_throttled_one_point_cancelled_then_retried(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # Point 2's first attempt sleeps 300 s (--sleep-if 2); the others 2 s, one at a time.
    runner = _start(tmp_path, "--grid", "k=0,1,2,3,4", "--max-parallel", "1", "--",
                    sys.executable, POINT, str(out), "--sleep", "2",
                    "--sleep-if", "{k}")  # fmt: skip
    try:
        sweep_dir = _sweep_dir(tmp_path)
        _started(sweep_dir, 0)
        cancel = _hpclaunch(tmp_path, "sweep", "cancel", "last", "--points", "4")
        assert cancel.returncode == 0, cancel.stderr  # pending: it never starts
        throttle = _hpclaunch(tmp_path, "sweep", "throttle", "last", "2")
        assert throttle.returncode == 0, throttle.stderr  # from now on 2 at once
        _started(sweep_dir, 2, timeout=120)
        cancel = _hpclaunch(tmp_path, "sweep", "cancel", "last", "--points", "2")
        assert cancel.returncode == 0, cancel.stderr  # running: ended, the rest go on
        runner.wait(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 143, runner.stdout + runner.stderr
    status = _status(tmp_path)
    states = [p["state"] for p in status["points"]]
    assert states == ["COMPLETED", "COMPLETED", "CANCELLED", "COMPLETED", "CANCELLED"]
    assert _ran(sweep_dir, 4) == []
    assert most_at_once(_spans(sweep_dir, [0, 1, 2, 3])) == 2  # the throttle took effect

    retried = _hpclaunch(tmp_path, "sweep", "retry", "last")
    assert retried.returncode == 0, retried.stdout + retried.stderr
    status = _status(tmp_path)
    assert [p["state"] for p in status["points"]] == ["COMPLETED"] * 5
    assert [p["attempts"] for p in status["points"]] == [1, 1, 2, 1, 2]
    assert (sweep_dir / "points/2/attempts/1/logs").is_dir()  # the first attempt kept


def test_a_run_and_a_sweep_point_get_the_same_record_and_files(tmp_path: Path) -> None:
    """One run-folder writer and one run.json writer serve runs and points: every field
    of a RunRecord is in both records, and both folders hold spec.json beside job.sh."""
    from dataclasses import fields

    from hpclaunch.records.runrecord import RunRecord

    proc = _hpclaunch(tmp_path, "run", "--json", "--", sys.executable, "-c", "pass")
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(json.loads(proc.stdout.splitlines()[0])["run_dir"])
    proc = _hpclaunch(tmp_path, "sweep", "--json", "--grid", "k=1", "--",
                      sys.executable, "-c", "pass")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sweep_dir = Path(json.loads(proc.stdout.splitlines()[0])["sweep_dir"])
    wanted = {f.name for f in fields(RunRecord)} - {"extra", "events"}
    for folder in (run_dir, sweep_dir / "points" / "0"):
        stored = json.loads((folder / "run.json").read_text())
        assert wanted <= set(stored), sorted(wanted - set(stored))
    for folder in (run_dir, sweep_dir):
        assert (folder / "spec.json").is_file() and (folder / "job.sh").is_file()
        assert list((folder / "__pycache__").glob("hpclaunch_bootstrap.*.pyc"))


def test_one_local_point_is_cancelled_through_its_backend(tmp_path: Path) -> None:
    """What `cancel SWEEP:I` uses: the recorded point's backend ends it, whichever process
    runs it; the sweep's runner goes on with the other points."""
    from hpclaunch.backends import for_record

    out = tmp_path / "out"
    out.mkdir()
    # Point 2 sleeps 300 s; the others are quick, two at a time.
    runner = _start(tmp_path, "--grid", "k=0,1,2,3", "--max-parallel", "2", "--",
                    sys.executable, POINT, str(out), "--sleep-if", "{k}")  # fmt: skip
    try:
        sweep_dir = _sweep_dir(tmp_path)
        _started(sweep_dir, 2)
        point = runrecord.load(sweep_dir / "points" / "2")
        assert for_record(point.backend).cancel_recorded(point)
        runner.wait(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 143, runner.stdout + runner.stderr
    states = [p["state"] for p in _status(tmp_path)["points"]]
    assert states == ["COMPLETED", "COMPLETED", "CANCELLED", "COMPLETED"]


def test_ctrl_c_in_a_local_sweep_is_the_users_and_a_second_ends_the_ranks(
    tmp_path: Path,
) -> None:
    (tmp_path / "keeps_on.py").write_text(KEEPS_ON)
    runner = _start(tmp_path, "--grid", "k=0,1,2", "--max-parallel", "2", "--",
                    sys.executable, "keeps_on.py", "{k}")  # fmt: skip
    try:
        sweep_dir = _sweep_dir(tmp_path)
        logs = [sweep_dir / "points" / str(p) / "logs" / "rank-0.out" for p in (0, 1)]
        deadline = time.monotonic() + 60
        while not all(p.exists() and "up" in p.read_text() for p in logs):  # handler set
            assert time.monotonic() < deadline, "the points never started"
            time.sleep(0.1)
        runner.send_signal(signal.SIGINT)  # Ctrl-C: the grace period, the ranks carry on
        deadline = time.monotonic() + 60  # its own minute (the start may take the first)
        while not all(p.exists() and "term" in p.read_text() for p in logs):
            assert time.monotonic() < deadline, "the ranks never got SIGTERM"
            time.sleep(0.1)
        second = time.monotonic()
        runner.send_signal(signal.SIGINT)  # again: ended at once, not after 5 s
        out, err = runner.communicate(timeout=60)
        assert time.monotonic() - second < 4.0, err
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 130, err
    assert "Ctrl-C again to end them now" in out  # where the sweep shows its progress
    # The grace period is shown, as a local run's first Ctrl-C shows it (issue 29).
    assert "interrupted: waiting up to 5 s for the ranks to exit; Ctrl-C again" in out, out
    points = _status(tmp_path)["points"]
    assert [(p["state"], p["exit_code"]) for p in points] == [("CANCELLED", 130)] * 3
    reasons = [runrecord.load(sweep_dir / "points" / str(p)).reason for p in range(3)]
    assert all("interrupted by the user (Ctrl-C)" in r for r in reasons[:2]), reasons
    assert reasons[2] == "the local sweep was interrupted" and _ran(sweep_dir, 2) == []
