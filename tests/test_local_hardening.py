"""A newcomer's bad day with local runs (issue: hardening): an interrupted launcher
leaves nothing running, the record tells the truth, `logs --follow` returns, `cancel`
and `clean` work without Slurm and without $USER; "the same command locally" runs the
--setup lines, enforces -t and names what cannot apply; every run ends with a summary."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import hpclaunch
from builders import KEEPS_ON, bare_local_env
from conftest import VENV_BIN

HPCLAUNCH = str(VENV_BIN / "hpclaunch")
SLEEPER = "import time; print('up', flush=True); time.sleep(300)"


def _hpclaunch(
    tmp_path: Path, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPCLAUNCH, *args], cwd=tmp_path, env=bare_local_env(tmp_path), capture_output=True,
        text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [HPCLAUNCH, "run", *args], cwd=tmp_path, env=bare_local_env(tmp_path), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def _run_dir(tmp_path: Path) -> Path:
    return next((tmp_path / "runs" / "default").iterdir())


def _wait_for(check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _rank_pids(run_dir: Path) -> list[int]:
    lines = (run_dir / "logs" / "ranks.tsv").read_text().splitlines()
    return [int(line.split("\t")[3]) for line in lines]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def _ranks_up(tmp_path: Path, count: int) -> bool:
    runs = tmp_path / "runs" / "default"
    if not runs.is_dir() or not any(runs.iterdir()):
        return False
    logs = _run_dir(tmp_path) / "logs"
    return sum(1 for p in logs.glob("rank-*.out") if "up" in p.read_text()) == count


def _status(tmp_path: Path) -> dict[str, Any]:
    proc = _hpclaunch(tmp_path, "status", "last", "--json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def test_sigkilled_launcher_leaves_nothing_running(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("x")
    launcher = _start(tmp_path, "--tasks-per-node", "2", "--stage", "data", "--",
                      sys.executable, "-c", SLEEPER)  # fmt: skip
    _wait_for(lambda: _ranks_up(tmp_path, 2))
    run_dir = _run_dir(tmp_path)
    pids = _rank_pids(run_dir)
    # The ranks start inside the backend's start(); the launcher records the job's
    # details (local_dir) only once start() has returned.
    _wait_for(lambda: "local_dir" in json.loads((run_dir / "run.json").read_text()))
    record = json.loads((run_dir / "run.json").read_text())
    local_dir = Path(record["local_dir"])
    assert record["job_id"].startswith("local-") and local_dir.is_dir()
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    _wait_for(lambda: not any(_alive(p) for p in pids), timeout=30)
    status = _status(tmp_path)
    assert (status["state"], status["exit_code"]) == ("CANCELLED", 143), status
    assert "ended before the run" in status["reason"]
    found = hpclaunch.get("last", environ=bare_local_env(tmp_path))  # another process's run
    assert found.wait(timeout=30) == 143
    follow = _hpclaunch(tmp_path, "logs", "last", "--follow", timeout=60)
    # logs --follow ends with the run's own exit code (issue 28 item 6), here 143
    assert follow.returncode == 143 and "up" in follow.stdout
    cleaned = _hpclaunch(tmp_path, "clean", "--json")
    assert cleaned.returncode == 0, cleaned.stderr
    assert json.loads(cleaned.stdout)["removed"] == [str(local_dir)]
    assert not local_dir.exists()


def test_cancel_ends_a_local_run_from_another_terminal(tmp_path: Path) -> None:
    launcher = _start(tmp_path, "--tasks-per-node", "2", "--", sys.executable, "-c", SLEEPER)
    _wait_for(lambda: _ranks_up(tmp_path, 2))
    pids = _rank_pids(_run_dir(tmp_path))
    cancel = _hpclaunch(tmp_path, "cancel", "last")
    assert cancel.returncode == 0, cancel.stderr
    assert launcher.wait(timeout=60) == 128 + signal.SIGTERM
    assert not any(_alive(p) for p in pids)
    assert _status(tmp_path)["state"] == "CANCELLED"
    again = _hpclaunch(tmp_path, "cancel", "last")
    assert again.returncode == 2 and "already ended (CANCELLED)" in again.stderr


def test_setup_lines_time_limit_and_notes_locally(tmp_path: Path) -> None:
    greet = "import os; print(os.environ['GREETING'], os.environ['RANK'])"
    proc = _hpclaunch(tmp_path, "run", "--setup", "export GREETING=hi-from-setup",
                      "--mem", "1G", "-p", "debug", "--tasks-per-node", "2", "--",
                      sys.executable, "-c", greet)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "hi-from-setup 0" in proc.stdout and "hi-from-setup 1" in proc.stdout
    notes = [line for line in proc.stderr.splitlines() if "note:" in line]
    assert notes == [
        "hpclaunch: note: --mem, --partition do not apply to a local run (no Slurm): ignored"
    ]
    started = time.monotonic()
    timed = _hpclaunch(tmp_path, "run", "-t", "0:02", "--", sys.executable, "-c", SLEEPER)
    assert timed.returncode == 124, timed.stderr
    assert time.monotonic() - started < 30
    assert _status(tmp_path)["state"] == "TIMEOUT"
    failing = _hpclaunch(tmp_path, "run", "--setup", "false", "--", "true")
    assert failing.returncode == 1 and "a --setup line failed" in failing.stderr


def test_every_run_ends_with_a_summary_and_json_stays_json(tmp_path: Path) -> None:
    code = "import os, sys; rank = os.environ['RANK']; sys.exit(3 if rank == '1' else 0)"
    proc = _hpclaunch(tmp_path, "run", "--tasks-per-node", "2", "--", sys.executable, "-c", code)
    assert proc.returncode == 3
    last = proc.stderr.splitlines()[-1]
    assert re.match(r"hpclaunch: run \S+ FAILED, exit code 3, \d+\.\ds; rank 1 on \S+ failed "
                    r"first \(exit code 3\)$", last), last  # fmt: skip
    status = _hpclaunch(tmp_path, "status", "last")
    assert last.removeprefix("hpclaunch: ") in status.stdout
    as_json = _hpclaunch(tmp_path, "run", "--json", "--", sys.executable, "-c", "print('hi')")
    assert as_json.returncode == 0
    objects = [json.loads(line) for line in as_json.stdout.splitlines()]  # JSON only
    assert objects[0]["job_id"].startswith("local-")
    assert objects[-1]["state"] == "COMPLETED" and "hi" in as_json.stderr


def _on_a_terminal(tmp_path: Path, *argv: str, **env: str) -> str:
    argv = argv or ("run", "--tasks-per-node", "2", "--", sys.executable, "-c", "print('hi')")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [HPCLAUNCH, *argv],
        cwd=tmp_path, env=bare_local_env(tmp_path, **env), stdout=follower, stderr=follower,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_ranks_are_coloured_on_a_terminal_only(tmp_path: Path) -> None:
    coloured = _on_a_terminal(tmp_path)
    assert "\x1b[36m[" in coloured and "\x1b[33m[" in coloured  # rank 0 and rank 1
    assert "\x1b[" not in _on_a_terminal(tmp_path, NO_COLOR="1").replace("\x1b[K", "")
    piped = _hpclaunch(tmp_path, "run", "--", sys.executable, "-c", "print('hi')")
    assert "\x1b[" not in piped.stdout


def _dataset(folder: Path, files: int, size: int) -> None:
    folder.mkdir()
    block = os.urandom(size)
    for n in range(files):
        (folder / f"f{n:04d}.bin").write_bytes(block)


def _local_dirs() -> set[Path]:
    return set(Path("/tmp").glob("hpclaunch-local-*"))


@pytest.mark.serial  # compares every hpclaunch-local-* folder in /tmp before and after
@pytest.mark.parametrize("moment", ["packing", "staging"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_start_leaves_only_a_record(tmp_path: Path, moment: str, sig: int) -> None:
    _dataset(tmp_path / "data", files=600, size=512 * 1024)  # 300 MiB: packing takes a while
    cache = tmp_path / "runs" / ".stage-cache"
    if moment == "staging":  # packed by an earlier run: this one goes straight to unpacking
        first = _hpclaunch(tmp_path, "run", "--stage", "data", "--", "true", timeout=300)
        assert first.returncode == 0, first.stderr
        for run in (tmp_path / "runs" / "default").iterdir():
            subprocess.run(["rm", "-rf", str(run)], check=True)
    before = _local_dirs()
    launcher = _start(tmp_path, "--stage", "data", "--", sys.executable, "-c", SLEEPER)

    def started() -> bool:
        if moment == "packing":
            return cache.is_dir() and any(p.name.startswith(".") for p in cache.iterdir())
        return bool(_local_dirs() - before)

    _wait_for(started, timeout=120)
    os.kill(launcher.pid, sig)
    assert launcher.wait(timeout=60) == 128 + sig
    assert _local_dirs() == before  # no partly staged data left in /tmp
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no partial pack
    [run_dir] = list((tmp_path / "runs" / "default").iterdir())
    assert [p.name for p in run_dir.iterdir()] == ["run.json"]
    status = _status(tmp_path)
    assert status["state"] == "CANCELLED" and "interrupted by" in status["reason"], status


# The exit codes of ended runs (docs/internals.md, README): a row per cause, locally.


@pytest.mark.parametrize(
    ("sig", "code", "reason"),
    [
        (signal.SIGINT, 130, "interrupted by the user (Ctrl-C)"),
        (signal.SIGTERM, 143, "hpclaunch got SIGTERM"),
        (signal.SIGHUP, 129, "hpclaunch got SIGHUP"),
    ],
)
def test_a_signal_to_a_local_run_is_recorded_as_its_cause(
    tmp_path: Path, sig: int, code: int, reason: str
) -> None:
    launcher = _start(tmp_path, "--tasks-per-node", "2", "--", sys.executable, "-c", SLEEPER)
    _wait_for(lambda: _ranks_up(tmp_path, 2))
    pids = _rank_pids(_run_dir(tmp_path))
    os.kill(launcher.pid, sig)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == code, err
    assert "waiting up to 5 s for the ranks to exit; Ctrl-C again to end them now" in err
    assert not any(_alive(p) for p in pids)
    status = _status(tmp_path)
    assert (status["state"], status["exit_code"]) == ("CANCELLED", code), status
    assert reason in status["reason"] and "ended before the run" not in status["reason"]


def test_a_second_ctrl_c_ends_the_ranks_at_once(tmp_path: Path) -> None:
    launcher = _start(tmp_path, "--tasks-per-node", "2", "--", sys.executable, "-c", KEEPS_ON)
    _wait_for(lambda: _ranks_up(tmp_path, 2))
    run_dir = _run_dir(tmp_path)
    pids = _rank_pids(run_dir)
    os.kill(launcher.pid, signal.SIGINT)
    logs = list((run_dir / "logs").glob("rank-*.out"))
    _wait_for(lambda: all("term" in p.read_text() for p in logs))  # they carry on
    second = time.monotonic()
    os.kill(launcher.pid, signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert time.monotonic() - second < 4.0, err  # not the 5 s grace period
    assert launcher.returncode == 130, err
    assert not any(_alive(p) for p in pids)
    status = _status(tmp_path)
    assert (status["state"], status["exit_code"]) == ("CANCELLED", 130), status
    assert "interrupted by the user (Ctrl-C)" in status["reason"]


def test_a_cancelled_local_run_is_recorded_as_cancelled(tmp_path: Path) -> None:
    launcher = _start(tmp_path, "--tasks-per-node", "2", "--", sys.executable, "-c", SLEEPER)
    _wait_for(lambda: _ranks_up(tmp_path, 2))
    assert _hpclaunch(tmp_path, "cancel", "last").returncode == 0
    assert launcher.wait(timeout=60) == 143
    status = _status(tmp_path)
    assert (status["state"], status["exit_code"]) == ("CANCELLED", 143), status
    assert status["reason"].startswith("cancelled"), status


def test_a_local_run_past_its_time_limit_is_a_timeout(tmp_path: Path) -> None:
    proc = _hpclaunch(tmp_path, "run", "-t", "0:00:02", "--", sys.executable, "-c", SLEEPER)
    status = _status(tmp_path)
    assert (proc.returncode, status["state"], status["exit_code"]) == (124, "TIMEOUT", 124)


def test_two_local_nodes_tag_their_ranks_with_the_simulated_node(tmp_path: Path) -> None:
    hello = "import os; print('hi', os.environ['NODE_RANK'], flush=True)"
    proc = _hpclaunch(tmp_path, "run", "-N", "2", "--tasks-per-node", "2", "--",
                      sys.executable, "-c", hello)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    host = socket.gethostname().split(".")[0]
    tags = sorted(re.findall(r"^\[([^\]]+)\] hi (\d)$", proc.stdout, re.M))
    assert tags == [(f"{host}/node0 0", "0"), (f"{host}/node0 1", "0"),
                    (f"{host}/node1 2", "1"), (f"{host}/node1 3", "1")]  # fmt: skip
    one = _hpclaunch(tmp_path, "run", "--", sys.executable, "-c", hello)
    assert f"[{host} 0] hi 0" in one.stdout  # one node: the host's own name, as before


SCORED = (
    "import json, os, sys\n"
    "lr = float(sys.argv[1])\n"
    "if lr > 0.25:\n"
    "    sys.exit(3)\n"
    "with open(os.environ['HPCLAUNCH_RESULT_FILE'], 'w') as f:\n"
    "    json.dump({'loss': abs(lr - 0.1)}, f)\n"
)  # point 2 (lr=0.3) fails; point 1 (lr=0.1) has the lowest loss


def _scored_sweep(tmp_path: Path) -> tuple[str, ...]:
    (tmp_path / "scored.py").write_text(SCORED)
    return ("sweep", "--grid", "lr=0.05,0.1,0.3", "--metric", "loss", "--max-parallel", "2",
            "--", sys.executable, "scored.py", "{lr}")  # fmt: skip


def test_a_local_sweep_ends_with_a_summary_and_remembers_its_metric(tmp_path: Path) -> None:
    proc = _hpclaunch(tmp_path, *_scored_sweep(tmp_path))
    assert proc.returncode == 3, proc.stdout + proc.stderr  # the failed point's code
    sweep_id = proc.stdout.split()[1]
    tail = proc.stdout.splitlines()[-3:]
    assert tail == [
        f"sweep {sweep_id}: 3 points: 2 COMPLETED, 1 FAILED",
        "best (loss, minimize): point 1  lr=0.1  loss=0.0",
        f"point 2 FAILED (exit 3): hpclaunch logs {sweep_id}:2",
    ], proc.stdout
    assert f"sweep {sweep_id}: 2/3 done, 0 running, 0 pending, 1 failed" in proc.stdout
    status = _hpclaunch(tmp_path, "sweep", "status", "last", "--json")
    found = json.loads(status.stdout)
    assert found["metric"] == "loss" and found["best"]["index"] == 1, found
    shown = _hpclaunch(tmp_path, "sweep", "status", "last").stdout
    assert "best (loss, minimize): point 1" in shown


def test_a_local_sweep_shows_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    seen = _on_a_terminal(tmp_path, *_scored_sweep(tmp_path))
    assert "━" in seen and "3/3" in seen, seen  # rich's bar, as sweep wait draws it
    assert "best (loss, minimize): point 1" in seen
