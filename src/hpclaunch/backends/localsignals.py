"""A local run's signals: Ctrl-C, SIGTERM and SIGHUP to hpclaunch while it supervises
the ranks, noted and handled in order (the first gives the ranks a grace period, a
second ends them at once), and what a person sees and the record keeps of them."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The ranks' grace period between SIGTERM and SIGKILL: a local run's and a local sweep's
# points' (LocalPlan.kill_grace_s), which the first Ctrl-C's line shows.
KILL_GRACE_S = 5.0


class SignalBox:
    """Ctrl-C, SIGTERM and SIGHUP noted, never raised, while hpclaunch supervises a step
    (from its spawn when the caller supervises it next): the loop that watches the tasks
    looks at them every tick. An exception raised wherever the signal landed (between the
    spawn and the watch, while the ranks were being ended, while the end was written)
    left ranks nobody ended, or a run whose end was never recorded. Another thread (a
    local sweep's runner) puts its interrupt here too. Only the main thread may set
    handlers; elsewhere only those interrupts arrive."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self._old: dict[int, Any] | None = None

    def hold(self) -> None:
        if self._old is not None or threading.current_thread() is not threading.main_thread():
            return
        self._old = {sig: signal.signal(sig, self._note) for sig in _STOP_SIGNALS}

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.pending.append(signum)

    def take(self) -> int | None:
        return self.pending.pop(0) if self.pending else None

    def release(self) -> None:
        """The old handlers back; what came after the end is dropped (the run is over)."""
        old, self._old = self._old, None
        for sig, handler in (old or {}).items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self.pending.clear()


class Stopped(Exception):
    """A signal to hpclaunch (or a runner's interrupt) while the tasks ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def waiting_line(signum: int, grace_s: float) -> str:
    """What a person sees when the first Ctrl-C (or SIGTERM) reaches a local run."""
    why = "interrupted" if signum == signal.SIGINT else f"got {signal.Signals(signum).name}"
    return (
        f"hpclaunch: {why}: waiting up to {grace_s:g} s for the ranks to exit; "
        "Ctrl-C again to end them now\n"
    )


def stop_reason(signum: int) -> str:
    """The recorded reason of a run a signal to hpclaunch ended."""
    if signum == signal.SIGINT:
        return "interrupted by the user (Ctrl-C); its ranks were ended"
    return f"hpclaunch got {signal.Signals(signum).name}; its ranks were ended"
