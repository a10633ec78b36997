"""What a new user met on the cluster (issue #28, newuser1's items), on the real testbed:
a failing `--setup` line and `logs --follow` on a failed run."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import Hpc

SETUP = "echo loading the modules; no-such-module-command load pytorch"


def test_a_failing_setup_line_shows_its_output_and_keeps_a_failed_record(hpc: Hpc) -> None:
    done = hpc.run("run", "--wait", "--setup", SETUP, "--", "python3", "-c", "print('ran')")
    assert done.returncode != 0, done.stdout + done.stderr
    assert "ran" not in done.stdout
    assert "no-such-module-command: command not found" in done.stderr, done.stderr
    assert "loading the modules" in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "a --setup line failed (exit 127)" in last
    # The setup's own last words are in the error line and the record, not only the log.
    assert "no-such-module-command: command not found" in last, last
    (row,) = hpc.runs()
    record = json.loads((Path(row["run_dir"]) / "run.json").read_text())
    assert record["state"] == "FAILED", record
    assert "--setup" in (record.get("reason") or ""), record
    assert "command not found" in record["reason"], record


def test_logs_follow_on_a_failed_slurm_run_exits_with_its_code(hpc: Hpc) -> None:
    program = "import sys, time; print('working', flush=True); time.sleep(3); sys.exit(4)"
    started = hpc.run("run", "--", "python3", "-c", program)
    assert started.returncode == 0, started.stderr
    followed = hpc.run("logs", "last", "--follow")
    assert "working" in followed.stdout
    assert followed.returncode == 4, followed.stderr
    last = followed.stderr.strip().splitlines()[-1]
    assert "FAILED, exit code 4" in last, last


def test_the_watch_window_reaches_the_batch_scripts_watch(hpc: Hpc) -> None:
    shown = hpc.run("run", "--gpus-per-node", "1", "--dry-run", "--watch-window", "30",
                    "--watch-warmup", "5", "--", "python3", "-c", "pass")  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    (line,) = [ln for ln in shown.stdout.splitlines() if "gpu_watch.py" in ln]
    assert " --window 30 --warmup 5 " in line
