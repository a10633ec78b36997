"""What a new user met on one machine (issue #28, newuser1's items): `logs --follow` on a
failed run, a failing `--setup` line, the GPU watch's window and its start on a
workstation with GPUs. Real local runs (`--cluster local`), no Slurm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HPCLAUNCH = str(Path(sys.executable).parent / "hpclaunch")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPCLAUNCH"))}
    env.update(XDG_DATA_HOME=str(tmp_path / "xdg"), HPCLAUNCH_CLUSTER="local", **extra)
    return env


def _hpclaunch(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPCLAUNCH, *args], cwd=tmp_path, env=_env(tmp_path, **extra),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_logs_follow_ends_with_the_summary_and_the_runs_exit_code(tmp_path: Path) -> None:
    program = "import sys, time; print('working', flush=True); time.sleep(2); sys.exit(3)"
    started = subprocess.Popen(
        [HPCLAUNCH, "run", "--cluster", "local", "--", sys.executable, "-c", program],
        cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not list((tmp_path / "runs").rglob("run.json")) and time.monotonic() < deadline:
            time.sleep(0.1)
        followed = _hpclaunch(tmp_path, "logs", "last", "--follow")
    finally:
        started.communicate(timeout=60)
    assert started.returncode == 3
    assert "working" in followed.stdout
    assert followed.returncode == 3, followed.stderr
    last = followed.stderr.strip().splitlines()[-1]
    assert last.startswith("hpclaunch: run ") and "FAILED, exit code 3" in last, last
    again = _hpclaunch(tmp_path, "logs", "last", "--follow")  # an ended run: at once, same
    assert again.returncode == 3 and again.stderr.strip().splitlines()[-1] == last
    plain = _hpclaunch(tmp_path, "logs", "last")  # without --follow: the output only
    assert plain.returncode == 0 and "FAILED" not in plain.stderr


def test_a_failing_setup_line_shows_its_output_and_keeps_a_failed_record(tmp_path: Path) -> None:
    setup = "echo loading the modules; no-such-module-command load pytorch"
    done = _hpclaunch(tmp_path, "run", "--setup", setup, "--", sys.executable, "-c", "print(1)")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "a --setup line failed (exit 127)" in done.stderr
    assert "no-such-module-command: command not found" in done.stderr  # the lines' output
    assert "loading the modules" in done.stderr
    (folder,) = [p.parent for p in (tmp_path / "runs").rglob("run.json")]  # kept
    assert "command not found" in (folder / "logs" / "batch.out").read_text()
    record = json.loads((folder / "run.json").read_text())
    assert (record["state"], record["exit_code"]) == ("FAILED", 127)
    assert record["reason"].startswith("a --setup line failed (exit 127)")
    listed = _hpclaunch(tmp_path, "runs")
    assert folder.name in listed.stdout and "FAILED" in listed.stdout
