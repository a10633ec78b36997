"""Watch a job: wait for its end while its logs stream, turn that end into an exit code.

No Slurm calls here: states come from a `StatusSource` (backends/slurm.py asks squeue /
sacct) and the logs from the run directory (docs/internals.md), so all of it is tested
with real files and a scripted source.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Protocol, TextIO

from hpclaunch.basics import states

# Re-exported: callers take these from here.
from hpclaunch.basics.states import EXIT_OTHER_FAILURE as EXIT_OTHER_FAILURE
from hpclaunch.basics.states import EXIT_UNKNOWN as EXIT_UNKNOWN
from hpclaunch.observe import nodelogs, waiting
from hpclaunch.observe.logs import AttemptFollower, safe_write

_LOG_POLL_S = 0.2
_DRAIN_WAIT_S = 2.0


def exit_code_of(returncode: int) -> int:
    """A `subprocess` return code as a shell exit status: killed by signal N -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def first_failure(log_dir: Path) -> int | None:
    """Exit code of the rank that failed first (earliest `time` in its exit record: a
    rank-R.exit file or an exits.jsonl line; ties: the lower rank), or None. Unreadable
    or foreign records are passed over: the other ranks still tell the story."""
    first = nodelogs.first_failed(log_dir)
    return None if first is None else exit_code_of(first.returncode)


def _slurm_exit(code: str | None) -> int | None:
    """sacct's `exit:signal` (`3:0` -> 3, `0:9` -> 137); None when it says nothing."""
    if not code:
        return None
    head, _, sig = code.strip().partition(":")
    try:
        status, signum = int(head), int(sig or 0)
    except ValueError:
        return None
    if signum > 0:
        return 128 + signum
    return status if status > 0 else None


def job_exit_code(state: str, log_dir: Path, slurm_exit_code: str | None) -> int:
    """The exit code of `hpclaunch run --wait` for a job that ended in `state`."""
    parsed = states.parse(state)
    by_state = states.exit_code_for(parsed)
    if by_state is not None:
        # The state explains the ranks' deaths (scancel/timeout send SIGTERM, OOM SIGKILL):
        # reporting 143/137 there would hide why the job ended.
        return by_state
    failure = first_failure(log_dir)
    if failure is not None:
        return failure
    if parsed is states.State.COMPLETED:
        return 0
    if parsed is states.State.FAILED:
        code = _slurm_exit(slurm_exit_code)
        return code if code is not None else EXIT_UNKNOWN
    return EXIT_UNKNOWN


class JobStatus(NamedTuple):
    state: str
    reason: str
    exit_code: str | None


def chain_status(
    job_ids: Sequence[str], found: Mapping[str, JobStatus], ran: Sequence[int]
) -> Optional[JobStatus]:
    """A chain's state from its members' (one status call for all of them): a running
    member's, else a pending one's, else the last member that ran (its place is its
    attempt number; later members a done program cancelled do not count)."""
    statuses = [found.get(job) for job in job_ids]
    for wanted in (states.is_streaming, states.is_active):
        for status in statuses:
            if status is not None and wanted(states.parse(status.state)):
                return status
    last = max(ran) if ran else 0
    return statuses[last] if last < len(statuses) else None


class StatusSource(Protocol):
    def status(self, job_id: str) -> JobStatus: ...


def _elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class _StatusLine:
    """One line about a waiting job: redrawn in place on a terminal, else on change only."""

    def __init__(self, stream: TextIO, is_tty: bool) -> None:
        self._stream = stream
        self._tty = is_tty
        self._shown: tuple[str, str] | None = None
        self._active = False

    @property
    def redraws(self) -> bool:
        return self._tty

    def show(self, state: str, reason: str, elapsed: float) -> None:
        reason = "" if reason.strip() in ("", "None", "(null)") else reason.strip()
        text = state.lower() + (f" ({reason})" if reason else "") + f" ... {_elapsed(elapsed)}"
        if self._tty:
            # A wrapped line cannot be redrawn with \r: keep it within the terminal width.
            width = shutil.get_terminal_size((80, 24)).columns - 1
            safe_write(self._stream, "\r" + text[:width] + "\x1b[K")
            self._active = True
        elif self._shown != (state, reason):
            safe_write(self._stream, text + "\n")
        else:
            return
        self._shown = (state, reason)
        self._stream.flush()

    def end(self, keep: bool = False) -> None:
        """Clear the line, or (keep, on Ctrl-C) leave it visible and start a new line."""
        if self._active:
            self._stream.write("\n" if keep else "\r\x1b[K")
            self._stream.flush()
        self._active = False
        self._shown = None  # waiting again later (requeue) prints the line again


def wait_and_stream(
    source: StatusSource,
    job_id: str,
    log_dir: Path,
    out: TextIO,
    err: TextIO,
    *,
    is_tty: bool,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    backoff: waiting.Backoff = waiting.DEFAULT,
    unknown_retries: int = 0,
) -> tuple[int, str]:
    """Follow a job until it ends, streaming its logs; return (exit code, final state).
    TimeoutError once `clock()` passes `deadline` (the job keeps running).

    Status calls follow waiting.Backoff (the one policy of every wait: it runs for hours
    against a shared slurmctld); a new rank-*.exit file brings the next call forward,
    never nearer than 5 s. A job the source does not know is asked about again
    `unknown_retries` times before it counts as UNKNOWN. KeyboardInterrupt propagates.
    """
    seen = _Seen(AttemptFollower(log_dir, out, err), _StatusLine(err, is_tty), clock())
    seen.unknown_left = unknown_retries

    def ask(now: float) -> str | None:
        seen.status = source.status(job_id)
        parsed = states.parse(seen.status.state)
        seen.asked_at = now
        if parsed is states.State.UNKNOWN and seen.unknown_left > 0:
            seen.unknown_left -= 1
            return waiting.UNSURE
        seen.unknown_left = unknown_retries
        seen.state = parsed.value
        if not states.is_active(parsed):
            return None
        if states.is_streaming(parsed):
            if not seen.streaming:
                seen.streaming = True
                seen.line.end()
            return waiting.RUNNING
        seen.streaming = False
        seen.line.show(seen.state, seen.status.reason, now - seen.start)
        return waiting.PENDING

    try:
        waiting.until_ended(
            ask,
            backoff,
            between=seen.between,
            tick_s=lambda: _LOG_POLL_S if seen.streaming else 1.0,
            clock=clock,
            sleep=sleep,
            deadline=deadline,
            timeout_message=lambda: f"job {job_id} still {seen.state}",
        )
    except BaseException:
        seen.line.end(keep=True)
        raise
    seen.line.end()
    follower = seen.follower
    # The shared file system may show exit files and last writes a little late: wait for
    # an exit file from every rank that started, at most a couple of seconds.
    drain_until = clock() + _DRAIN_WAIT_S
    while True:
        follower.poll()
        started = set(follower.nodes)
        if (started and started <= follower.exited) or clock() >= drain_until:
            break
        sleep(_LOG_POLL_S)
    follower.drain()
    code = job_exit_code(seen.state, follower.rank_dir, seen.status.exit_code)
    if code != 0 and len(follower.nodes) > 1:  # many ranks: which failed first, and how
        safe_write(err, "".join(line + "\n" for line in nodelogs.digest(follower.rank_dir)))
    return code, seen.state


class _Seen:
    """What one wait_and_stream has seen so far, and its work between status calls."""

    def __init__(self, follower: AttemptFollower, line: _StatusLine, start: float) -> None:
        self.follower, self.line, self.start = follower, line, start
        self.status = JobStatus(states.State.UNKNOWN.value, "", None)
        self.state = states.State.UNKNOWN.value
        self.streaming = False
        self.exits = 0
        self.asked_at = start
        self.unknown_left = 0

    def between(self, now: float) -> bool:
        """Stream new log lines (True when a rank exited), or redraw the waiting line."""
        if self.streaming:
            self.follower.poll()
            exited = len(self.follower.exited)
            if exited > self.exits:
                self.exits = exited
                return True
        elif self.line.redraws and now > self.asked_at:
            # The elapsed time on a terminal moves between two calls.
            self.line.show(self.state, self.status.reason, now - self.start)
        return False
