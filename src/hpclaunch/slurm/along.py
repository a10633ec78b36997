"""Queries that go along with planning's own Slurm questions: a sweep's sacctmgr (its
MaxSubmitJobs) is asked in the same round as scontrol show config and sinfo
(discover.ask_together), each in a thread, so that their waits on the controller and
the accounting database overlap instead of adding up.

A query is started only where planning asks Slurm itself (a Slurm backend's plan):
where the plan asks nothing (a local run), nothing is asked along. Every round starts
anew, so an answer is never older than the plan it was started with.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Optional

from hpclaunch.slurm import commands

_WANTED: dict[tuple[str, ...], float] = {}  # argv -> timeout, until planning asks Slurm
_ASKED: dict[tuple[str, ...], tuple[threading.Thread, list[Optional[str]]]] = {}


@contextlib.contextmanager
def asked_along(argv: Sequence[str], timeout: float) -> Iterator[None]:
    """While planning inside this block asks Slurm, `argv` is asked with it; read the
    answer with `answer` (after the block too)."""
    key = tuple(argv)
    _WANTED[key] = timeout
    try:
        yield
    finally:
        _WANTED.pop(key, None)


def start() -> None:
    """Start every wanted query (discover.ask_together calls this with its own two)."""
    for key, timeout in list(_WANTED.items()):
        del _WANTED[key]
        box: list[Optional[str]] = []
        thread = threading.Thread(target=_ask, args=(list(key), timeout, box), daemon=True)
        thread.start()
        _ASKED[key] = (thread, box)


def _ask(argv: list[str], timeout: float, box: list[Optional[str]]) -> None:
    box.append(commands.query(argv, timeout=timeout))


def answer(argv: Sequence[str], timeout: float) -> Optional[str]:
    """The answer of a query started along (waited for), else asked now: stdout, or
    None when the command is missing, slow or fails (commands.query)."""
    started = _ASKED.pop(tuple(argv), None)
    if started is None:
        return commands.query(argv, timeout=timeout)
    thread, box = started
    thread.join()
    return box[0] if box else None
