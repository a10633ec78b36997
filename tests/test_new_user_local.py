"""What a new user met on one machine (issue #28, newuser1's items): `logs --follow` on a
failed run, a failing `--setup` line, the GPU watch's window and its start on a
workstation with GPUs. Real local runs (`--cluster local`), no Slurm."""

from __future__ import annotations

import json
import os
import re
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


GPU_DOUBLES = Path(__file__).parent / "doubles" / "gpu"


def test_watch_window_and_warmup_are_run_options_shown_in_help(tmp_path: Path) -> None:
    shown = _hpclaunch(tmp_path, "run", "--help")
    assert "--watch-window SECONDS" in shown.stdout and "--watch-warmup SECONDS" in shown.stdout
    bad = _hpclaunch(tmp_path, "run", "--watch-window", "1", "--", "true")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "hpclaunch: error: --watch-window: 1.0 seconds (5 to 86400). Give e.g. --watch-window 60"
    )


def test_a_local_run_on_a_machine_with_gpus_gets_the_watch_and_its_warning(
    tmp_path: Path,
) -> None:
    """The stand-in nvidia-smi lists 2 GPUs (`-L`) that stay idle: the local run samples
    them into metrics/ and warns after the run's own --watch-window/--watch-warmup."""
    pattern = tmp_path / "idle.json"
    pattern.write_text(json.dumps({"gpus": [{"samples": [[0, 1000, 90.0]]}] * 2}))
    gpus = {
        "PATH": f"{GPU_DOUBLES}:{os.environ['PATH']}",
        "HPCLAUNCH_FAKE_GPU_PATTERN": str(pattern),
    }
    program = "import time; print('training'); time.sleep(8)"
    watch = ("--watch-interval", "0.5", "--watch-window", "5", "--watch-warmup", "0")
    done = _hpclaunch(tmp_path, "run", *watch, "--", sys.executable, "-c", program, **gpus)
    assert done.returncode == 0, done.stderr
    (folder,) = [p.parent for p in (tmp_path / "runs").rglob("run.json")]
    (csv_file,) = (folder / "metrics").glob("gpu-*.csv")
    rows = csv_file.read_text().splitlines()
    assert rows[0] == "time,node,gpu,busy_pct,mem_mib,power_w" and len(rows) > 10
    # The window is the span the samples cover: 5 s, a second either way on a busy machine.
    assert re.search(r"input-bound\? over the last [4-6] s, all 2 GPUs", done.stderr), done.stderr
    events = (folder / "events.jsonl").read_text()
    assert '"input_bound"' in events
    top = _hpclaunch(tmp_path, "top", "last", "--json")
    assert top.returncode == 0 and '"gpu"' in top.stdout, top.stdout + top.stderr
    off = _hpclaunch(tmp_path, "run", "--no-watch", "--", sys.executable, "-c", "pass", **gpus)
    assert off.returncode == 0
    newest = max((p.parent for p in (tmp_path / "runs").rglob("run.json")), key=lambda p: p.name)
    assert newest != folder and not (newest / "metrics").exists()


def test_a_local_run_without_gpu_tools_has_no_watch(tmp_path: Path) -> None:
    done = _hpclaunch(tmp_path, "run", "--", sys.executable, "-c", "pass")
    assert done.returncode == 0, done.stderr
    (folder,) = [p.parent for p in (tmp_path / "runs").rglob("run.json")]
    assert not (folder / "metrics").exists() and not (folder / "gpu_watch.py").exists()


def test_a_batch_scripts_failed_setup_reason_carries_the_setups_last_words(
    tmp_path: Path,
) -> None:
    """On a cluster the setup's output scrolls by in the job's log; the FAILED reason
    (status, --wait's last line) carries its last line itself."""
    from hpclaunch.backends.runstatus import setup_failure
    from hpclaunch.records import runrecord

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "batch.out").write_text(
        "loading the modules\nbash: line 12: module: command not found\n\n"
    )
    (tmp_path / "events.jsonl").write_text('{"event":"setup_failed","exit_code":127,"time":1}\n')
    reason = setup_failure(tmp_path, runrecord.read_events(tmp_path))
    assert reason is not None
    assert reason.startswith("a --setup line failed (exit 127): bash: line 12: module: command")
    assert reason.endswith(f"see {tmp_path / 'logs' / 'batch.out'}")
