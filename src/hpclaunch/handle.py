"""`Run`: the handle the Python API returns for a run, started here or found later.

Learnt from submitit's Job: one object that knows the run's id, asks its state, waits,
reads logs and the result, and cancels, whatever backend runs it. A handle made by
`hpclaunch.run()` holds the backend that started the job (local processes and steps
are children of this process); one made by `hpclaunch.get()` asks the run's recorded
backend.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Union

from hpclaunch import node
from hpclaunch.backends import for_record, of_record, runstatus
from hpclaunch.backends.base import cancel_all
from hpclaunch.basics import states
from hpclaunch.errors import UserError
from hpclaunch.launching import Started, finish
from hpclaunch.observe import waiting
from hpclaunch.observe.logs import AttemptFollower, LogFollower
from hpclaunch.records import runrecord
from hpclaunch.records.runpaths import CANCELLED_FILE, RunPaths, rank_logs
from hpclaunch.records.runrecord import RunRecord

_POLL_S = 0.25  # how often new log lines are looked for (the state: waiting.Backoff)


class Run:
    """A run: `.id`, `.state`, `.wait()`, `.logs()`, `.follow()`, `.cancel()`,
    `.result()`, `.record`."""

    def __init__(self, run_dir: Path, started: Optional[Started] = None) -> None:
        self._dir = Path(run_dir)
        self._started = started
        self._code: Optional[int] = None

    def __repr__(self) -> str:
        return f"Run({self.id!r}, state={self.record.state!r})"

    @property
    def id(self) -> str:
        return self._started.run_id if self._started else self.record.run_id

    @property
    def run_dir(self) -> Path:
        return self._dir

    @property
    def job_id(self) -> Optional[str]:
        return self._started.job_id if self._started else self.record.job_id

    @property
    def record(self) -> RunRecord:
        """run.json with the job's events folded in (as recorded; see `.state`)."""
        return runrecord.load(self._dir)

    @property
    def state(self) -> str:
        """The current state, Slurm's names: PENDING, RUNNING, COMPLETED, FAILED, ..."""
        if self._started is not None and self._code is None and self._started.backend.foreground:
            found = self._started.backend.status([self._started.job_id])
            status = found.get(self._started.job_id)
            if status is not None and states.is_active(states.parse(status.state)):
                return states.parse(status.state).value
        return runstatus.refresh_one(self._dir).state

    def wait(self, timeout: Optional[float] = None) -> int:
        """Block until the run ends; its exit code (docs/api.md). TimeoutError after
        `timeout` seconds (the run goes on). Prints nothing: see `follow()`."""
        sink = io.StringIO()
        return self._wait(sink, sink, timeout)

    def follow(self) -> int:
        """Stream every rank's output, tagged `[node rank]`, until the run ends; its exit code."""
        return self._wait(sys.stdout, sys.stderr, None)

    def _wait(self, out: Any, err: Any, timeout: Optional[float]) -> int:
        if self._code is not None:
            return self._code
        if self._started is not None:
            code, _ = finish(self._started, out, err, timeout=timeout)
        else:
            code = self._wait_recorded(out, err, timeout)
        self._code = code
        return code

    def _wait_recorded(self, out: Any, err: Any, timeout: Optional[float]) -> int:
        record = self.record
        backend = of_record(record)
        if record.job_id and not backend.foreground:  # the scheduler answers for the job
            started = Started(
                record.run_id, _paths(record), record.job_id, backend, None, tuple(record.job_ids)
            )
            return finish(started, out, err, timeout=timeout)[0]
        # A run another process supervises (local, step): its record says when it ended.
        deadline = None if timeout is None else time.monotonic() + timeout
        follower = AttemptFollower(self._dir / "logs", out, err)
        record = follow_to_end(self._dir, follower, deadline)
        return record.exit_code if record.exit_code is not None else 120

    def logs(self, rank: Optional[int] = None, attempt: Optional[int] = None) -> str:
        """Everything the ranks wrote so far, each line tagged `[node rank]`: of the
        latest attempt (--requeue), or of `attempt` (its ranks only)."""
        buffer = io.StringIO()
        follower: Union[LogFollower, AttemptFollower]
        if attempt is not None:
            follower = LogFollower(
                rank_logs(self._dir, attempt), buffer, buffer, rank=rank, include_batch=False
            )
        else:
            follower = AttemptFollower(
                self._dir / "logs", buffer, buffer, rank=rank, include_batch=rank is None
            )
        follower.poll()
        follower.drain()
        return buffer.getvalue()

    def cancel(self) -> None:
        """End the run (scancel for a Slurm job; the process groups of a local run)."""
        # A requeued run's batch shell looks for this before it queues the next attempt:
        # a cancel that lands while it requeues must not be undone by the requeue.
        with contextlib.suppress(OSError):
            (self._dir / CANCELLED_FILE).touch()
        if self._started is not None:
            started = self._started
            cancel_all(started.backend, [*started.job_ids[1:], started.job_id])
            return
        record = self.record
        if not record.job_id:
            raise UserError("RUN", f"{record.run_id} has no job to cancel", "", "")
        for_record(record.backend).cancel_recorded(record)

    def result(self) -> Any:
        """The JSON value rank 0 wrote to $HPCLAUNCH_RESULT_FILE, or None."""
        try:
            return json.loads((self._dir / node.RESULT_JSON).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None


def follow_to_end(
    run_dir: Path,
    follower: Union[LogFollower, AttemptFollower],
    deadline: Optional[float] = None,
    *,
    backoff: Optional[waiting.Backoff] = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RunRecord:
    """Print the ranks' new lines until the run's record, brought up to date through the
    one wait loop (waiting.py: backed off, never below the cluster's min_poll_interval),
    says it has ended; TimeoutError at `deadline` (the run goes on)."""
    seen = [runrecord.load(run_dir)]
    exits = [len(follower.exited)]
    if backoff is None:
        backoff = waiting.for_cluster(seen[0].cluster)

    def ask(now: float) -> Optional[str]:
        record = seen[0] = runstatus.refresh_one(run_dir)
        if not states.is_open(record.state):
            return None
        return waiting.RUNNING if states.is_streaming(record.state) else waiting.PENDING

    def between(now: float) -> bool:
        follower.poll()  # log lines stream at once; only status calls are spaced
        exited = len(follower.exited)
        if exited > exits[0]:
            exits[0] = exited
            return True  # the end is near: ask sooner (never nearer than Backoff.exit_s)
        return False

    waiting.until_ended(
        ask,
        backoff,
        between=between,
        tick_s=lambda: _POLL_S,
        clock=clock,
        sleep=sleep,
        deadline=deadline,
        timeout_message=lambda: f"run {seen[0].run_id} still {seen[0].state}",
    )
    follower.drain()
    return seen[0]


def _paths(record: RunRecord) -> RunPaths:
    return RunPaths(record.run_id, Path(record.run_dir), Path(record.checkpoint_dir))
