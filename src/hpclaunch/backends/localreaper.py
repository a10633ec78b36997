"""A local run's reaper: its ranks end with their launcher, even a SIGKILLed one.

The tasks of a local run live in their own sessions (so that a terminal's Ctrl-C reaches
hpclaunch only, which then ends them in order). If hpclaunch itself dies without
cleaning up (SIGKILL, an OOM kill), nothing would end them: they would move under PID 1
and run to the end. So every local run starts this tiny stdlib-only process first, in a
session of its own, reading a pipe from hpclaunch: one line per task process group as
they start, then end-of-file when hpclaunch ends, for whatever reason (the kernel closes
the pipe). At end-of-file it ends the groups that are still there (SIGTERM, SIGKILL
after a grace period) and appends an event saying the launcher was gone, which the
record reads as how the run ended. After a normal end the groups are already gone and
it exits without a word.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import IO, Optional

from hpclaunch.records.locking import process_owner, same_process
from hpclaunch.records.locking import process_start as process_start  # local.py takes it from here

LAUNCHER_GONE = "launcher_gone"

_PROGRAM = """\
import json, os, signal, sys, time
events, grace = sys.argv[1], float(sys.argv[2])
groups = []
for line in sys.stdin:
    if line.strip().isdigit():
        groups.append(int(line))
def alive():
    left = []
    for g in groups:
        try:
            os.killpg(g, 0)
            left.append(g)
        except OSError:
            pass
    return left
left = alive()
if left:
    for g in left:
        try: os.killpg(g, signal.SIGTERM)
        except OSError: pass
    end = time.monotonic() + grace
    while alive() and time.monotonic() < end:
        time.sleep(0.1)
    for g in alive():
        try: os.killpg(g, signal.SIGKILL)
        except OSError: pass
    line = json.dumps({"event": "launcher_gone", "groups": left, "time": time.time()})
    try:
        fd = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, (line + "\\n").encode())
        os.close(fd)
    except OSError:
        pass
"""


class Reaper:
    """Started before the tasks; `watch(pgid)` for each; `close()` after a clean end."""

    def __init__(self, events_file: str, grace_s: float) -> None:
        self._proc: Optional[subprocess.Popen[bytes]] = subprocess.Popen(
            [sys.executable or "python3", "-I", "-S", "-c", _PROGRAM, events_file, str(grace_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C or killpg aimed at hpclaunch misses it
            close_fds=True,
        )
        self._pipe: Optional[IO[bytes]] = self._proc.stdin

    def watch(self, pgid: int) -> None:
        if self._pipe is not None:
            self._pipe.write(f"{pgid}\n".encode())
            self._pipe.flush()

    def close(self) -> None:
        """The tasks have ended: let the reaper see end-of-file and leave."""
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                self._pipe.close()
            self._pipe = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None


def launcher_alive(pid: Optional[int], started: Optional[float]) -> bool:
    """Whether the hpclaunch process that supervises a local run still runs."""
    return launcher_gone(pid, started) is None


def launcher_gone(pid: Optional[int], started: Optional[float]) -> Optional[str]:
    """Why the hpclaunch process that supervised a local run is gone, or None while it
    runs. Pids are reused, also by other users' processes (whose kill(pid, 0) fails with
    EPERM, which is no sign of life): the process must be this user's and have the
    recorded start time."""
    if not pid:
        return "no launcher was recorded"
    if not same_process(pid, None):
        return "ended"
    owner = process_owner(pid)
    me = os.getuid()
    if owner is not None and me != 0 and owner != me:
        return f"its pid is now a process of another user (uid {owner})"
    if not same_process(pid, started):
        return "its pid is now another process"
    return None
