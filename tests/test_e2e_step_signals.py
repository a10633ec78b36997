"""Ctrl-C to `hpclaunch run` inside `salloc` (a step of the allocation, backends/step.py)
on the real testbed: the first shows the grace period, the site's KillWait, and reaches
the ranks as a SIGINT; a second ends the step at once; the run is recorded as the user's
Ctrl-C (130, CANCELLED). The logic with a stand-in srun: tests/test_step_signals.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, Hpc
from test_e2e_dev import Session

pytestmark = pytest.mark.testbed
PROGRAM = str(REPO / "tests" / "programs" / "keeps_on_ctrl_c.py")


def _kill_wait(hpc: Hpc) -> str:
    out = hpc.cmd(["scontrol", "show", "config"]).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("KillWait"))
    return line.partition("=")[2].split()[0]


def test_ctrl_c_inside_salloc_waits_kill_wait_and_a_second_ends_the_step(hpc: Hpc) -> None:
    # The pid of hpclaunch itself (salloc's child): a terminal's Ctrl-C reaches it so.
    inner = 'echo "hpclaunch pid $$" >&2; exec "$@"'
    session = Session(
        hpc.cwd, hpc.env,
        "salloc", "-N", "1", "sh", "-c", inner, "sh",
        "hpclaunch", "run", "--wait", "--", "python", PROGRAM, "300",
    )  # fmt: skip
    try:
        pid = int(session.until("hpclaunch pid").rsplit(" ", 1)[1])
        session.until("ready 0")
        os.kill(pid, signal.SIGINT)
        waiting = session.until("waiting up to")
        assert waiting == (
            f"hpclaunch: interrupted: waiting up to {_kill_wait(hpc)} s for the ranks "
            "to exit; Ctrl-C again to end them now"
        )
        session.until("got SIGINT 0")  # srun handed the Ctrl-C to the ranks
        second = time.monotonic()
        os.kill(pid, signal.SIGINT)
        while _alive(pid) and time.monotonic() - second < 60:
            time.sleep(0.05)
        # hpclaunch's own end (not salloc's release of the allocation, which follows):
        # at once, not after KillWait
        ended_after = time.monotonic() - second
        code = session.finish(timeout=120)
        assert ended_after < 4, (ended_after, session.lines)
    finally:
        with contextlib.suppress(ProcessLookupError):  # salloc may be gone already
            session.kill()
    assert code == 130, session.lines
    record = json.loads(hpc.run("status", "--json").stdout)
    assert (record["state"], record["exit_code"]) == ("CANCELLED", 130), record
    assert "interrupted by the user (Ctrl-C)" in record["reason"], record
    assert not subprocess.run(["pgrep", "-f", PROGRAM], capture_output=True).stdout
    assert Path(record["run_dir"]).is_dir()


def _alive(pid: int) -> bool:
    """Whether hpclaunch (salloc's child, reaped by salloc as it ends) still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
