"""The seam between the orchestrator and every way of running a planned job.

A backend knows how to start a planned run (or a sweep's array parts: start_array),
ask about many of its jobs in one call (plain job ids and array-task ids "123_4"
alike), wait for one, and cancel one (or one recorded by another process:
cancel_recorded); the orchestrator (launching.py) owns everything else
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
from typing import TYPE_CHECKING, Any, Optional, TextIO

from hpclaunch.backends.requests import DryRun
from hpclaunch.basics.states import State
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.errors import HpclaunchError
from hpclaunch.observe.jobend import JobStatus, chain_status, wait_and_stream
from hpclaunch.observe.waiting import for_cluster
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.records.runrecord import RunRecord
from hpclaunch.script.render import BatchPlan

if TYPE_CHECKING:
    from hpclaunch.records.runrecord import RunRecord


@dataclass(frozen=True)
class Launch:
    """Everything a backend needs to start one planned run."""

    spec: JobSpec
    plan: BatchPlan
    paths: RunPaths
    cwd: Path  # where the tasks start: the code snapshot when there is one
    environ: Mapping[str, str]  # the requester's environment (never os.environ itself)
    # The caller waits for it next (hpclaunch run): a foreground backend notes a Ctrl-C
    # from the start on for its wait instead of raising it in between.
    attached: bool = False


@dataclass(frozen=True)
class ArrayPart:
    """One array job of a sweep: its tasks run the points offset + SLURM_ARRAY_TASK_ID."""

    offset: int
    array: str  # the task ids as Slurm's --array value ("0-999%3", "3,7,10-12%2")


@dataclass(frozen=True)
class ArrayLaunch:
    """Everything a backend needs to start a sweep's points as job arrays: the array
    script (planned once, a point's number filled in per task) and its parts."""

    job_sh: Path
    parts: Sequence[ArrayPart]
    environ: Mapping[str, str]  # the requester's environment
    secret_env: tuple[tuple[str, str], ...] = ()  # the job's environment only, never a file


class Backend(ABC):
    """start -> job id; status of many ids at once; wait; cancel; logs."""

    name: str = ""  # recorded in run.json: "slurm", "local", "step"
    kind: str = "job"  # how the announcement names what was started
    foreground: bool = False  # the job ends when this process does (local, step)
    unknown_retries: int = 0  # while waiting: ask again before calling a job UNKNOWN
    # What the rest of hpclaunch asks instead of the backend's name (tests/test_layout.py):
    runs_here: bool = False  # the ranks are processes on this machine: no Slurm at all
    asks_sinfo: bool = True  # a profile with `discover` is filled in from sinfo
    snapshots_by_default: bool = True  # the code is copied unless --no-snapshot
    step_of_allocation: bool = False  # a step of the allocation this process runs in

    def dry_run(self, launch: Launch) -> DryRun[Any]:
        """What start(launch) would do, nothing started (torchx's submit_dryrun): the
        request and how --dry-run shows it. Secret values appear only as $NAME."""
        raise NotImplementedError(f"{type(self).__name__} has no dry-run")

    @abstractmethod
    def start(self, launch: Launch) -> str:
        """Start the run's job; return its job id. Nothing may be left running on error."""

    def start_array(self, launch: ArrayLaunch) -> list[str]:
        """Queue a sweep's array parts; their job ids, in order ("123": tasks "123_4").
        All or none: a part refused cancels those already queued."""
        raise HpclaunchError(f"the {self.kind} backend runs no job arrays")

    def record_extra(self, job_id: str) -> dict[str, object]:
        """What the run record should also keep about a job this backend started (or,
        after `status`, learnt: an array task's own job id)."""
        return {}

    def site_facts(self) -> dict[str, object]:
        """What a record keeps about the site, for a later process's `learn`."""
        return {}

    def learn(self, record: RunRecord) -> None:
        """Take what a record kept (site facts, a job's other ids) before `status`."""
        return None

    def running_jobs(self) -> list[str]:
        """The jobs this backend started in this process that have not ended."""
        return []

    def settle(self, record: RunRecord) -> dict[str, object]:
        """The end of an open recorded job whose supervisor is gone, as record changes
        (empty: nothing to settle; the scheduler's `status` answers)."""
        return {}

    def commands_run(self) -> list[str]:
        """The scheduler commands this backend ran so far (for counting)."""
        return []

    def interrupt(self, job_id: str, signum: int = 2) -> None:
        """End a job as signal `signum` (2: Ctrl-C) to its supervisor would (a local
        sweep's runner was interrupted); a job the scheduler runs is cancelled."""
        self.cancel(job_id)

    def end_reason(self, job_id: str) -> str:
        """Why a job `wait` saw end ended, where the backend knows it (a Ctrl-C); ""."""
        return ""

    def cancel_many(self, job_ids: Sequence[str]) -> None:
        """End several jobs (one call where the scheduler allows)."""
        for job_id in job_ids:
            self.cancel(job_id)

    def cancel_recorded(self, record: RunRecord, job_ids: Sequence[str] = ()) -> bool:
        """End a recorded run or sweep point, whichever process supervises it (default:
        its jobs, or `job_ids`); True when something was asked to end."""
        job = str(record.job_id or "")
        chain = len(record.job_ids) > 1 and "_" not in job  # a point's are its attempts
        ids = list(job_ids) or ([*record.job_ids[1:], job] if chain else [job])
        ids = list(dict.fromkeys(j for j in ids if j))
        cancel_all(self, ids)  # the later members of a chain first; fails only if none ends
        return bool(ids)

    def cancel_records(self, recs: Sequence[RunRecord], whole: bool) -> list[str]:
        """End these recorded jobs (a sweep's points); `whole`: every open point of the
        sweep, so whole arrays ("123" for tasks "123_4"). One call; what was cancelled."""
        if whole:
            ids = sorted({str(r.job_id).partition("_")[0] for r in recs if r.job_id})
        else:
            ids = [str(r.job_id) for r in recs if r.job_id]
        self.cancel_many(ids)
        return ids

    def throttle(self, job_id: str, parallel: int) -> None:
        """At most `parallel` tasks of array `job_id` at once from now on."""
        raise HpclaunchError(f"the {self.kind} backend runs no job arrays")

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
        pass first (the job keeps running). Status calls follow the one back-off
        (waiting.py) under the run's cluster profile's min_poll_interval."""
        source = _Chain(self, members, paths) if len(members) > 1 else _OneJob(self, job_id)
        from hpclaunch.records.runrecord import load

        backoff = for_cluster(load(paths.run_dir).cluster)
        return wait_and_stream(
            source,
            job_id,
            paths.logs,
            out,
            err,
            is_tty=is_tty,
            deadline=None if timeout is None else time.monotonic() + timeout,
            backoff=backoff,
            unknown_retries=self.unknown_retries,
        )

    def logs(self, paths: RunPaths) -> Path:
        """Where the job's per-rank logs are (the same layout for every backend)."""
        return paths.logs


def cancel_all(backend: Backend, jobs: Sequence[str]) -> None:
    """Cancel every job (those that already ended refuse): an error only when none could be."""
    from hpclaunch.errors import HpclaunchError

    failures: list[HpclaunchError] = []
    unique = list(dict.fromkeys(jobs))
    for job in unique:
        try:
            backend.cancel(job)
        except HpclaunchError as exc:
            failures.append(exc)
    if failures and len(failures) == len(unique):
        raise failures[-1]


class _Chain:
    """A --chain's state: its members asked in one call, combined (jobend.chain_status)."""

    def __init__(self, backend: Backend, members: Sequence[str], paths: RunPaths) -> None:
        self._backend = backend
        self._members = list(members)
        self._paths = paths

    def status(self, job_id: str) -> JobStatus:
        from hpclaunch.records.runrecord import read_events

        ran = [a.number for a in read_events(self._paths.run_dir).attempts]
        found = chain_status(self._members, self._backend.status(self._members), ran)
        return found or JobStatus(State.UNKNOWN.value, "Slurm no longer knows the chain", None)


class _OneJob:
    """jobend asks about one job; backends answer for many at once."""

    def __init__(self, backend: Backend, job_id: str) -> None:
        self._backend = backend
        self._job_id = job_id

    def status(self, job_id: str) -> JobStatus:
        # One call: the wait loop asks again (Backend.unknown_retries, spaced by the
        # back-off) before it takes UNKNOWN for an answer.
        found = self._backend.status([job_id]).get(job_id)
        if found is not None and found.state != State.UNKNOWN:
            return found
        return JobStatus(State.UNKNOWN.value, "Slurm no longer knows the job", None)
