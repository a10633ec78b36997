"""The seam between the orchestrator and every way of running a planned job.

A backend knows how to start a planned run, ask about many of its jobs in one call,
wait for one, and cancel one; the orchestrator (launching.py) owns everything else
(run folder, record, index, announcement, final state), written once for all of them.
`wait` and `logs` have one implementation here, built on `status`, because every
backend's ranks write the same log files into the run folder; backends whose jobs run
in the foreground (local processes, a step of this allocation) override `wait`.

Learnt from torchx's Scheduler (schedule / describe / cancel / log_iter), written small
enough that a test implements it in a few lines (tests/test_backend_seam.py).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, TextIO

from ..monitor import JobStatus, chain_status, wait_and_stream
from ..render import BatchPlan
from ..rundirs import RunPaths
from ..spec import JobSpec
from ..states import State


@dataclass(frozen=True)
class Launch:
    """Everything a backend needs to start one planned run."""

    spec: JobSpec
    plan: BatchPlan
    paths: RunPaths
    cwd: Path  # where the tasks start: the code snapshot when there is one
    environ: Mapping[str, str]  # the requester's environment (never os.environ itself)


class Backend(ABC):
    """start -> job id; status of many ids at once; wait; cancel; logs."""

    name: str = ""  # recorded in run.json: "slurm", "local", "step"
    kind: str = "job"  # how the announcement names what was started
    foreground: bool = False  # the job ends when this process does (local, step)
    unknown_retries: int = 0  # while waiting: ask again before calling a job UNKNOWN
    retry_wait_s: float = 2.0

    @abstractmethod
    def start(self, launch: Launch) -> str:
        """Start the run's job; return its job id. Nothing may be left running on error."""

    def record_extra(self, job_id: str) -> dict[str, object]:
        """What the run record should also keep about a job this backend started."""
        return {}

    @abstractmethod
    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """The state of every id in one round trip (ids it does not know may be absent)."""

    @abstractmethod
    def cancel(self, job_id: str) -> None:
        """End the job; returns once the request is made (wait() sees the end)."""

    def wait(
        self,
        job_id: str,
        paths: RunPaths,
        out: TextIO,
        err: TextIO,
        *,
        is_tty: bool = False,
        timeout: Optional[float] = None,
        members: Sequence[str] = (),
    ) -> tuple[int, str]:
        """Stream the ranks' output until the job ends: (exit code, final state); of a
        --chain (`members`), until the chain ends. TimeoutError when `timeout` seconds
        pass first (the job keeps running)."""
        source = _Chain(self, members, paths) if len(members) > 1 else _OneJob(self, job_id)
        return wait_and_stream(
            source,
            job_id,
            paths.logs,
            out,
            err,
            is_tty=is_tty,
            deadline=None if timeout is None else time.monotonic() + timeout,
        )

    def logs(self, paths: RunPaths) -> Path:
        """Where the job's per-rank logs are (the same layout for every backend)."""
        return paths.logs


class _Chain:
    """A --chain's state: its members asked in one call, combined (monitor.chain_status)."""

    def __init__(self, backend: Backend, members: Sequence[str], paths: RunPaths) -> None:
        self._backend = backend
        self._members = list(members)
        self._paths = paths

    def status(self, job_id: str) -> JobStatus:
        from ..records import read_events

        ran = [a.number for a in read_events(self._paths.run_dir).attempts]
        found = chain_status(self._members, self._backend.status(self._members), ran)
        return found or JobStatus(State.UNKNOWN.value, "Slurm no longer knows the chain", None)


class _OneJob:
    """The monitor asks about one job; backends answer for many at once."""

    def __init__(self, backend: Backend, job_id: str) -> None:
        self._backend = backend
        self._job_id = job_id

    def status(self, job_id: str) -> JobStatus:
        for attempt in range(self._backend.unknown_retries + 1):
            if attempt:
                time.sleep(self._backend.retry_wait_s)
            found = self._backend.status([job_id]).get(job_id)
            if found is not None and found.state != State.UNKNOWN:
                return found
        return JobStatus(State.UNKNOWN.value, "Slurm no longer knows the job", None)
