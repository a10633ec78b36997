"""A step of an allocation (backends/step.py) on Ctrl-C, SIGTERM and SIGHUP to hpclaunch,
with a stand-in for srun that behaves as the testbed's srun does with
SLURM_DISABLE_STATUS=1 (backends/stepsignals.py): one SIGINT reaches the ranks (here: it
is written down), SIGTERM ends the step at once (exit 137). The real srun is shown in
tests/test_e2e_step_signals.py."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpclaunch.backends.step import StepBackend
from hpclaunch.backends.stepsignals import DEFAULT_KILL_WAIT_S, StepStop, kill_wait_s
from hpclaunch.records.runpaths import RunPaths

# Ranks that note each SIGINT and go on (a program that catches Ctrl-C to save its state
# slowly), and end at once on SIGTERM as srun's forced termination ends them.
_FAKE_SRUN = """
import signal, sys, time
def on_int(signum, frame):
    print("INT", flush=True)
signal.signal(signal.SIGINT, on_int)
signal.signal(signal.SIGTERM, lambda s, f: sys.exit(137))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _fake_srun(tmp_path: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", _FAKE_SRUN], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def test_kill_wait_is_the_sites_or_slurms_default() -> None:
    assert kill_wait_s({"KillWait": "5 sec"}) == 5.0
    assert kill_wait_s({}) == kill_wait_s(None) == DEFAULT_KILL_WAIT_S == 30.0
    assert kill_wait_s({"KillWait": "soon"}) == DEFAULT_KILL_WAIT_S


def test_a_first_ctrl_c_shows_the_grace_and_a_second_ends_the_step_at_once(
    tmp_path: Path,
) -> None:
    srun, err = _fake_srun(tmp_path), io.StringIO()
    stop = StepStop(srun, 5.0, err)
    stop.on_signal(signal.SIGINT)
    assert err.getvalue() == (
        "hpclaunch: interrupted: waiting up to 5 s for the ranks to exit; "
        "Ctrl-C again to end them now\n"
    )
    assert srun.stdout is not None and srun.stdout.readline() == b"INT\n"
    stop.tick()  # within the grace period: the ranks go on
    assert srun.poll() is None
    stop.on_signal(signal.SIGINT)
    assert srun.wait(timeout=10) == 137 and stop.ended_at_once
    assert stop.signum == signal.SIGINT  # the first one is the run's cause


def test_the_grace_periods_end_ends_the_step(tmp_path: Path) -> None:
    srun, err = _fake_srun(tmp_path), io.StringIO()
    stop = StepStop(srun, 0.3, err)
    stop.on_signal(signal.SIGTERM)
    assert "got SIGTERM: waiting up to 0.3 s" in err.getvalue()
    time.sleep(0.4)
    stop.tick()
    assert srun.wait(timeout=10) == 137


def _backend_with(srun: subprocess.Popen[bytes], grace_s: float) -> StepBackend:
    backend = StepBackend()
    backend._procs["7"] = srun
    backend._grace_s["7"] = grace_s
    return backend


@pytest.mark.parametrize("second", [True, False], ids=["second-ctrl-c", "grace-over"])
def test_a_ctrl_c_to_hpclaunch_during_the_step_is_recorded_as_the_users(
    tmp_path: Path, second: bool
) -> None:
    """Through StepBackend.wait: the signals come to this process (hpclaunch), are held
    (no KeyboardInterrupt), and the run ends CANCELLED with 130 and the user's reason."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    paths = RunPaths("r1", run_dir, tmp_path / "ckpt")
    srun = _fake_srun(tmp_path)
    backend = _backend_with(srun, 60.0 if second else 0.5)

    def press() -> None:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)
        if second:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGINT)

    presser = threading.Thread(target=press)
    presser.start()
    err = io.StringIO()
    started = time.monotonic()
    code, state = backend.wait("7", paths, io.StringIO(), err, timeout=30)
    presser.join()
    assert (code, state) == (130, "CANCELLED") and srun.returncode == 137
    assert time.monotonic() - started < 20  # not the 60 s grace: the second ended it
    wanted = "up to 60 s" if second else "up to 0.5 s"
    assert wanted in err.getvalue() and "Ctrl-C again to end them now" in err.getvalue()
    assert backend.end_reason("7") == "interrupted by the user (Ctrl-C); its ranks were ended"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back
