"""One way to wait: the back-off every wait that asks Slurm obeys, and the one loop.

`hpclaunch run --wait`, `Run.wait()`, `logs --follow`, `sweep wait` and `top` ask about
their job through `Poll` (one `Backoff`), so a shared slurmctld sees the same bounded
load from all of them:

- pending: 0.25 s, doubling to 5 s; once the job has pended a minute, every 10 s (at
  most 6 calls a minute, however long it waits in the queue);
- running: 1 s, x1.5 to 10 s; a rank's exit brings the next call forward (the end is
  near) but never nearer than 5 s after the last one (a thousand ranks exiting one by
  one would otherwise ask once per exit);
- the site's floor, the profile's `min_poll_interval` (seconds): no two calls closer,
  whatever the above says (some sites' usage policies ask for one call a minute).

Reading log files between calls stays fast: only status calls are spaced. The clock
and sleep are arguments, so tests count the calls of hours of waiting in milliseconds
(tests/test_waiting.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

PENDING, RUNNING = "pending", "running"
# The backend did not know the job (a restarting controller, a job too new for squeue):
# ask again in Backoff.unsure_s without changing the phase.
UNSURE = "unsure"


@dataclass(frozen=True)
class Backoff:
    """When to ask about a job again: the one policy of every wait (module docstring)."""

    floor_s: float = 0.0  # the profile's min_poll_interval: no two calls closer
    pending_first_s: float = 0.25
    pending_max_s: float = 5.0  # while the job has pended less than pending_long_after_s
    pending_long_after_s: float = 60.0
    pending_long_max_s: float = 10.0  # then: at most 6 calls a minute
    running_first_s: float = 1.0
    running_max_s: float = 10.0
    exit_s: float = 5.0  # a rank's exit brings the next call no nearer than this
    unsure_s: float = 2.0
    every_s: Optional[float] = None  # a fixed interval instead (sweep wait --interval)

    def first(self, phase: str) -> float:
        return self.pending_first_s if phase == PENDING else self.running_first_s

    def grown(self, phase: str, interval: float, in_phase_s: float) -> float:
        """The interval after `interval`, the job `in_phase_s` seconds in this phase."""
        if phase == PENDING:
            cap = (
                self.pending_long_max_s
                if in_phase_s >= self.pending_long_after_s
                else self.pending_max_s
            )
            return min(interval * 2, cap)
        return min(interval * 1.5, self.running_max_s)

    def gap(self, interval: float) -> float:
        """The seconds actually waited: a fixed --interval, never below the site's floor."""
        return max(interval if self.every_s is None else self.every_s, self.floor_s)


DEFAULT = Backoff()  # no site floor


class Poll:
    """When the next status call is due, for one wait."""

    def __init__(self, backoff: Backoff, now: float) -> None:
        self.backoff = backoff
        self.due = now  # the first call at once
        self.last: Optional[float] = None
        self.phase = ""
        self.since = now
        self.interval = 0.0

    def is_due(self, now: float) -> bool:
        return now >= self.due

    def asked(self, now: float, phase: str) -> None:
        """A call was made at `now`; the job is in `phase` (PENDING, RUNNING or UNSURE)."""
        b = self.backoff
        self.last = now
        if phase == UNSURE:
            self.due = now + b.gap(b.unsure_s)
            return
        if phase != self.phase:
            self.phase, self.since, self.interval = phase, now, b.first(phase)
        else:
            self.interval = b.grown(phase, self.interval, now - self.since)
        self.due = now + b.gap(self.interval)

    def soon(self, now: float) -> None:
        """Something says the end is near (a rank exited): ask within exit_s of the last
        call, and back off again from there; never sooner."""
        b = self.backoff
        if self.last is None or self.interval <= b.exit_s:
            return  # the next call is already that near
        self.interval = b.exit_s
        self.due = min(self.due, max(now, self.last + b.gap(b.exit_s)))


def until_ended(
    ask: Callable[[float], Optional[str]],
    backoff: Backoff,
    *,
    between: Callable[[float], bool],
    tick_s: Callable[[], float],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    deadline: Optional[float] = None,
    timeout_message: Callable[[], str] = lambda: "still waiting",
) -> None:
    """THE wait loop. `ask(now)` makes one status call: the phase, or None once the job
    ended. `between(now)` does the cheap work between calls (reading logs) at least every
    `tick_s()` seconds: True when the end seems near. TimeoutError once `clock()` passes
    `deadline` (the job goes on)."""
    poll = Poll(backoff, clock())
    while True:
        now = clock()
        if deadline is not None and now >= deadline:
            raise TimeoutError(timeout_message())
        if poll.is_due(now):
            phase = ask(now)
            if phase is None:
                return
            poll.asked(now, phase)
        if between(clock()):
            poll.soon(clock())
        sleep(max(0.0, min(tick_s(), poll.due - clock())))


def site_floor(
    cluster: str, environ: Optional[Mapping[str, str]] = None, cwd: Optional[Path] = None
) -> float:
    """The profile's min_poll_interval for `cluster` (built-in < the user's file < the
    project's [clusters.NAME]); 0 when the profile cannot be read (it was read when the
    job was submitted; a wait does not fail over it)."""
    from hpclaunch.errors import HpclaunchError

    if not cluster:
        return 0.0
    if environ is None:
        from hpclaunch.basics.environ import environment

        environ = environment()
    try:
        from hpclaunch.config.layering import project_tables
        from hpclaunch.config.profiles import load_profile

        try:
            clusters = project_tables(cwd or Path.cwd(), environ)[1]
        except (HpclaunchError, OSError):
            clusters = {}
        return float(load_profile(cluster, clusters, environ).min_poll_interval)
    except (HpclaunchError, OSError, ValueError):
        return 0.0


def for_cluster(
    cluster: str, environ: Optional[Mapping[str, str]] = None, cwd: Optional[Path] = None
) -> Backoff:
    """The back-off of a wait on `cluster`: the one policy under the site's floor."""
    return Backoff(floor_s=site_floor(cluster, environ, cwd))
