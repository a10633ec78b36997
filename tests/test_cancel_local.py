"""`hpclaunch cancel` on a local sweep (no Slurm needed): `cancel last` while the sweep
runs takes the sweep (the newest thing started), not an older plain run; `cancel SWEEP:I`
ends that point's ranks and records it CANCELLED while the other points run on; RUN
commands given `last` or a folder find the same runs (refs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from builders import local_env
from hpclaunch.records import sweeprecord

HPCLAUNCH = str(Path(sys.executable).parent / "hpclaunch")
# Sleeps {k} seconds: a point given k=120 runs until it is cancelled.
SLEEPER = ("--", sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))", "{k}")


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPCLAUNCH, *args], cwd=tmp_path, env=local_env(tmp_path), capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def _start_sweep(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    sweep = subprocess.Popen(
        [HPCLAUNCH, "sweep", *args], cwd=tmp_path, env=local_env(tmp_path), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert sweep.stdout is not None
    first = sweep.stdout.readline()  # "sweep ID  local  N points  FOLDER"
    assert first.startswith("sweep "), first + sweep.stderr.read() if sweep.stderr else ""
    return sweep, Path(first.split()[-1])


def _point(sweep_dir: Path, number: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((sweep_dir / "points" / str(number) / "run.json").read_text())
    return data


def _wait_running(sweep_dir: Path, points: list[int], ranks: int) -> list[int]:
    """Until every rank of those points started; their pids."""
    deadline = time.monotonic() + 60
    while True:
        pids = []
        for number in points:
            events = sweep_dir / "points" / str(number) / "events.jsonl"
            lines = events.read_text().splitlines() if events.exists() else []
            found = [json.loads(line) for line in lines]
            pids += [e["pid"] for e in found if e.get("event") == "rank_start"]
        if len(pids) == ranks * len(points):
            return pids
        assert time.monotonic() < deadline, f"points {points} never started"
        time.sleep(0.2)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")


def test_cancel_last_takes_the_running_sweep_not_an_older_run(tmp_path: Path) -> None:
    assert _cli(tmp_path, "run", "--", "true").returncode == 0
    old = json.loads(_cli(tmp_path, "status", "last", "--json").stdout)
    sweep, sweep_dir = _start_sweep(
        tmp_path, "--grid", "k=120,121,122", "--max-parallel", "2", *SLEEPER
    )
    try:
        pids = _wait_running(sweep_dir, [0, 1], ranks=1)
        cancel = _cli(tmp_path, "cancel", "last")
        assert cancel.returncode == 0, cancel.stderr
        assert f"cancelled sweep {sweep_dir.name}: 3 open point(s)" in cancel.stdout
        assert sweep.wait(timeout=60) == 143  # every point cancelled: well before 120 s
    finally:
        sweep.kill()
    assert all(_gone(pid) for pid in pids)
    for number in range(3):  # point 2 was waiting for a free slot: it never started
        assert (_point(sweep_dir, number)["state"], _point(sweep_dir, number)["exit_code"]) == (
            "CANCELLED",
            143,
        )
    assert not (sweep_dir / "points" / "2" / "events.jsonl").exists()
    again = json.loads(_cli(tmp_path, "status", old["run_id"], "--json").stdout)
    assert again["state"] == "COMPLETED"  # the older plain run was never touched
    ended = _cli(tmp_path, "cancel", "last")
    assert ended.returncode == 2
    assert ended.stderr.startswith(f"hpclaunch: error: RUN: sweep {sweep_dir.name} has already")


def test_cancel_a_point_of_a_local_sweep(tmp_path: Path) -> None:
    sweep, sweep_dir = _start_sweep(
        tmp_path, "--grid", "k=3,120", "--max-parallel", "2", "--tasks-per-node", "2", *SLEEPER
    )
    try:
        pids = _wait_running(sweep_dir, [1], ranks=2)
        cancel = _cli(tmp_path, "cancel", f"{sweep_dir.name}:1", "--json")
        assert cancel.returncode == 0, cancel.stderr
        assert json.loads(cancel.stdout)["run_id"] == f"{sweep_dir.name}:1"
        assert sweep.wait(timeout=60) == 143  # point 1 ended well before its 120 s
    finally:
        sweep.kill()
    assert all(_gone(pid) for pid in pids)  # both of its ranks
    assert (_point(sweep_dir, 0)["state"], _point(sweep_dir, 0)["exit_code"]) == ("COMPLETED", 0)
    assert (_point(sweep_dir, 1)["state"], _point(sweep_dir, 1)["exit_code"]) == ("CANCELLED", 143)
    shown = json.loads(_cli(tmp_path, "status", f"{sweep_dir.name}:1", "--json").stdout)
    assert shown["state"] == "CANCELLED"
    # `last` is the sweep: for a RUN command, its most recently started point.
    last = json.loads(_cli(tmp_path, "status", "last", "--json").stdout)
    assert last["run_id"] == f"{sweep_dir.name}:1"
    by_folder = _cli(tmp_path, "status", f"runs/default/{sweep_dir.name}/points/0", "--json")
    assert json.loads(by_folder.stdout)["run_id"] == f"{sweep_dir.name}:0", by_folder.stderr
    ended = _cli(tmp_path, "cancel", f"{sweep_dir.name}:0")
    assert ended.returncode == 2
    assert f"RUN: {sweep_dir.name}:0 has already ended (COMPLETED)" in ended.stderr


def test_a_retried_point_leaves_its_cancel_with_the_old_attempt(tmp_path: Path) -> None:
    """`cancel SWEEP:I` marks the point's folder (a requeue or a local sweep reads it):
    a retry keeps the mark with the attempt it ended, so the new attempt may run."""

    point = tmp_path / "points" / "1"
    point.mkdir(parents=True)
    (point / "cancelled").touch()
    sweeprecord.keep_attempt(point, 1)
    assert not (point / "cancelled").exists()
    assert (point / "attempts" / "1" / "cancelled").exists()
