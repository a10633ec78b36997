"""A session's clock: the time its job has left (one squeue at the start), the warnings
10 and 2 minutes before the limit, and the wait until something ends the session: the
job's end (the limit, `hpclaunch cancel`), its server's or relay's end, a silent laptop.
Ctrl-C comes through as KeyboardInterrupt; the caller cleans up in every case."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from hpclaunch.backends import runstatus
from hpclaunch.basics import states
from hpclaunch.basics.units import parse_time
from hpclaunch.errors import UserError
from hpclaunch.observe import waiting
from hpclaunch.slurm import commands

WARN_AT_S = (600, 120)  # warnings this many seconds before the time limit


def time_left(job_id: str) -> Optional[int]:
    """Seconds the job has left, as squeue says (%L); None when it cannot say."""
    text = commands.query(["squeue", "-h", "-j", job_id, "-o", "%L"]) or ""
    try:
        return parse_time(text.strip().splitlines()[0]) if text.strip() else None
    except UserError:
        return None  # UNLIMITED, NOT_SET


def left_text(seconds: float) -> str:
    if seconds < 60:
        return f"{max(0, int(seconds))} s"
    minutes = int(seconds // 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def hold(
    run_dir: Path,
    left_s: Optional[int],
    *,
    still_up: Callable[[], Optional[str]],
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    ask_state: Callable[[Path], str] = lambda d: runstatus.refresh_one(d).state,
) -> str:
    """Until the session ends: why it ended, in words. still_up() names what ended on
    this side (a server, the relay, the heartbeat), else None."""
    start = clock()
    end = None if left_s is None else start + left_s
    warned = {w for w in WARN_AT_S if left_s is not None and left_s <= w}
    poll = waiting.Poll(waiting.DEFAULT, start)
    while True:
        now = clock()
        gone = still_up()
        if gone:
            return _why_ended(run_dir, gone, ask_state, sleep)
        if end is not None:
            for mark in WARN_AT_S:
                if mark not in warned and end - now <= mark:
                    warned.add(mark)
                    say(f"hpclaunch: warning: the session ends in {left_text(end - now)}")
        if poll.is_due(now):
            state = ask_state(run_dir)
            if states.parse(state) in states.TERMINAL:
                return f"its job ended ({state})"
            poll.asked(now, waiting.RUNNING)
        sleep(0.5)


def _why_ended(
    run_dir: Path, gone: str, ask_state: Callable[[Path], str], sleep: Callable[[float], None]
) -> str:
    """The time limit or a cancel ends the job's steps first (the server, the relay): the
    job's own end is the reason then, once Slurm says it (a few seconds at most)."""
    for _ in range(3):
        state = ask_state(run_dir)
        if states.parse(state) in states.TERMINAL:
            return f"its job ended ({state})"
        sleep(2.0)
    return gone
