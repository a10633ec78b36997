"""The local backend: a planned run as processes on this machine, every "node" here,
with the same per-rank environment a Slurm step gives (localtasks.py).

Staged data goes into one node-local folder (every local node is this machine) before
the tasks start, and is copied out and removed when they end, as the staging guard does
on a cluster (it is the same code, node/stage_guard.py, run in-process).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TextIO

from hpclaunch import node
from hpclaunch.backends.base import Backend, Launch
from hpclaunch.backends.localplan import local_dry_run, local_plan, local_values
from hpclaunch.backends.localreaper import Reaper, process_start
from hpclaunch.backends.localsettle import cancel_point, cancel_recorded, settled
from hpclaunch.backends.localsignals import stop_reason
from hpclaunch.backends.localtasks import LocalPlan, LocalTasks, local_job_id
from hpclaunch.backends.requests import DryRun
from hpclaunch.basics import shell, states
from hpclaunch.basics.states import State
from hpclaunch.basics.users import with_user
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.errors import HpclaunchError, SetupFailed
from hpclaunch.node import stage_guard
from hpclaunch.observe.jobend import JobStatus
from hpclaunch.records.runpaths import CANCELLED_FILE, RunPaths, log_tail
from hpclaunch.records.runrecord import RunRecord
from hpclaunch.script import gpu_watch_lines, render

if TYPE_CHECKING:
    from hpclaunch.records.runrecord import RunRecord

PREFIX = "local-"  # local job ids read "local-123": never taken for a Slurm job id
OWNER = ".hpclaunch-launcher"  # in the node-local folder: "pid start" of the launcher


@dataclass
class _Job:
    tasks: LocalTasks
    stage_spec: Optional[dict[str, Any]]
    local_dir: str
    code: Optional[int] = None
    state: str = State.RUNNING.value
    watch: Optional[subprocess.Popen[bytes]] = None  # the GPU watch (a machine with GPUs)


class LocalBackend(Backend):
    name = "local"
    kind = "local job"
    foreground = True
    runs_here = True
    asks_sinfo = False
    snapshots_by_default = False  # the ranks start in the project itself

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}

    def start(self, launch: Launch) -> str:
        spec, plan, paths = launch.spec, launch.plan, launch.paths
        job_id = local_job_id()
        base = with_user(run_setup(spec.setup, launch.environ, launch.cwd, paths))
        values = local_values(spec, job_id, base)
        local_dir = ""
        if render.uses_local(spec, list(plan.task_env)):  # every local "node" is here: one
            with stage_guard.signals_held():  # made and known here, or not made at all
                local_dir = make_local_dir(job_id)
        tasks: Optional[LocalTasks] = None
        try:
            tasks = LocalTasks(
                local_plan(launch, job_id, base, values, local_dir),
                reaper=Reaper(str(paths.events), grace_s=5.0),
                time_limit_s=spec.time_s,
                attached=launch.attached,
            )
            stage_spec = _stage_in(spec, paths, local_dir)
            tasks.spawn()
            watch = _start_watch(spec, paths, launch.environ)
        except BaseException:
            if tasks is not None:
                tasks.abort()
            if local_dir:
                stage_guard.finish({}, local_dir, "local")  # partly staged data goes too
            raise
        self._jobs[PREFIX + str(job_id)] = _Job(tasks, stage_spec, local_dir, watch=watch)
        return PREFIX + str(job_id)

    def dry_run(self, launch: Launch) -> DryRun[LocalPlan]:
        """The command and the environment of every rank, as start() would make them;
        what only the start knows (job id, free port, node-local folder) as <...>."""
        return local_dry_run(launch)

    def record_extra(self, job_id: str) -> dict[str, object]:
        """Who supervises the run (so that another process can tell whether it still
        runs, and cancel it) and the task process groups."""
        job = self._jobs.get(job_id)
        if job is None:
            return {}
        me = os.getpid()
        return {
            "launcher_pid": me,
            "launcher_started": process_start(me),
            "pgids": job.tasks.pgids,
            "local_dir": job.local_dir,
        }

    def site_facts(self) -> dict[str, object]:
        """Who supervises the jobs started from here: this process (pid, start time)."""
        me = os.getpid()
        return {"launcher_pid": me, "launcher_started": process_start(me)}

    def running_jobs(self) -> list[str]:
        return [job_id for job_id, job in self._jobs.items() if job.code is None]

    def settle(self, record: RunRecord) -> dict[str, object]:
        return settled(record)

    def cancel_recorded(self, record: RunRecord, job_ids: Sequence[str] = ()) -> bool:
        """A job of this process: cancel it here. Another's: a sweep point is marked and
        its task groups ended (its sweep's runner goes on with the others, and starts no
        point so marked); a run's launcher is told to end it (it records the end)."""
        job = str(record.job_id or "")
        if job in self._jobs:
            self.cancel(job)
            return True
        if "sweep_id" in record.extra:
            return cancel_point(record)
        return cancel_recorded(record.launcher_pid, record.launcher_started, record.pgids)

    def cancel_records(self, recs: Sequence[RunRecord], whole: bool) -> list[str]:
        return [rec.run_id for rec in recs if self.cancel_recorded(rec)]

    def throttle(self, job_id: str, parallel: int) -> None:
        """Nothing to tell: a local sweep's runner reads --max-parallel from sweep.json
        before it starts each point."""

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        found: dict[str, JobStatus] = {}
        for job_id in job_ids:
            job = self._jobs.get(job_id)
            if job is None:
                continue
            # RUNNING until wait() has supervised the end (and ended the rest).
            found[job_id] = JobStatus(job.state, "", None)
        return found

    def cancel(self, job_id: str) -> None:
        job = self._jobs.get(job_id)
        if job is not None:
            job.tasks.cancel()

    def interrupt(self, job_id: str, signum: int = signal.SIGINT) -> None:
        job = self._jobs.get(job_id)
        if job is not None:
            job.tasks.interrupt(signum)

    def end_reason(self, job_id: str) -> str:
        job = self._jobs.get(job_id)
        if job is None:
            return ""
        if job.tasks.cancelled:
            return "cancelled; its ranks were ended"
        return "" if job.tasks.stopped_by is None else stop_reason(job.tasks.stopped_by)

    def wait(
        self,
        job_id: str,
        paths: RunPaths,
        out: TextIO,
        err: TextIO,
        *,
        is_tty: bool = False,
        timeout: Optional[float] = None,
        members: Sequence[str] = (),  # a --chain's: never here (Slurm only)
    ) -> tuple[int, str]:
        job = self._jobs[job_id]
        if job.code is not None:
            return job.code, job.state
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            # Signals stay noted until the staging and the watch are done: a second
            # Ctrl-C only hurries the end, it never leaves the run's end unwritten.
            code = job.tasks.supervise(out, err, deadline, keep_held=True)
            self._finish_staging(job)
            _stop_watch(job)
        except TimeoutError:
            raise
        except BaseException:
            self._finish_staging(job)
            _stop_watch(job)
            raise
        finally:
            job.tasks.release()
        if job.tasks.stopped_by == signal.SIGTERM and (paths.run_dir / CANCELLED_FILE).exists():
            job.tasks.cancelled = True  # the SIGTERM was `hpclaunch cancel`'s (handle.py)
        if job.tasks.timed_out:
            state = State.TIMEOUT.value
        elif job.tasks.cancelled:
            code, state = states.EXIT_CANCELLED, State.CANCELLED.value
        elif job.tasks.stopped_by is not None:
            state = State.CANCELLED.value  # Ctrl-C (130) or a signal to hpclaunch (128+N)
        else:
            state = State.COMPLETED.value if code == 0 else State.FAILED.value
        job.code, job.state = code, state
        return code, state

    def _finish_staging(self, job: _Job) -> None:
        if job.stage_spec is not None:
            stage_guard.finish(job.stage_spec, job.local_dir, "local")
            job.stage_spec = None


def _start_watch(
    spec: JobSpec, paths: RunPaths, environ: Mapping[str, str]
) -> Optional[subprocess.Popen[bytes]]:
    """The GPU watch of a local run on a machine with GPUs (validate decided: the GPU
    tools list some): one sampler beside the ranks, its warning on our stderr."""
    if not spec.watch_interval_s:
        return None
    argv = gpu_watch_lines.local_argv(spec, sys.executable, paths, os.getpid())
    try:
        return subprocess.Popen(argv, env=dict(environ), stdin=subprocess.DEVNULL)
    except OSError:
        return None  # no samples: the run itself goes on


def _stop_watch(job: _Job) -> None:
    """The ranks are done: SIGUSR1 (the batch script's signal too), its last samples."""
    watch, job.watch = job.watch, None
    if watch is None:
        return
    with contextlib.suppress(OSError):
        watch.send_signal(signal.SIGUSR1)
    try:
        watch.wait(timeout=10)
    except subprocess.TimeoutExpired:
        watch.kill()
        watch.wait()


def make_local_dir(job_id: int) -> str:
    """The run's node-local folder, fresh (mkdtemp: mode 700, a name nobody can guess, in
    $TMPDIR or /tmp), named with the launcher's pid and holding its marker from the
    start: `hpclaunch clean` and other runs leave it alone while this process runs."""
    prefix = f"{node.LOCAL_PREFIX}local-{job_id}-p{os.getpid()}."
    local_dir = tempfile.mkdtemp(prefix=prefix)
    marker = os.open(
        os.path.join(local_dir, OWNER), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
    )
    with os.fdopen(marker, "w", encoding="utf-8") as handle:
        handle.write(f"{os.getpid()} {process_start(os.getpid())}\n")
    return local_dir


def _stage_in(spec: JobSpec, paths: RunPaths, local_dir: str) -> Optional[dict[str, Any]]:
    """Unpack the staged data into the node-local folder; None when there is no folder."""
    if not local_dir:
        return None
    stage_spec = render.stage_json(spec, paths)
    try:
        stage_guard.prepare(stage_spec, local_dir)
    except OSError as exc:
        stage_guard.finish({}, local_dir, "local")
        raise HpclaunchError(f"staging failed: {exc}") from None
    return stage_spec


def run_setup(
    lines: Sequence[str], environ: Mapping[str, str], cwd: Path, paths: RunPaths
) -> dict[str, str]:
    """--setup lines run before the ranks, through bash as in the batch script (stopped
    at the first failure); the environment they leave is the tasks'. Their output goes
    to logs/batch.out, where a cluster's batch shell writes it."""
    if not lines:
        return dict(environ)
    paths.logs.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["bash", "-c", shell.setup_probe(lines)],
        env=dict(environ),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream: the log reads in the order it happened
        check=False,
    )
    out, _, dump = done.stdout.partition(shell.SETUP_MARK)
    with open(paths.logs / "batch.out", "ab") as log:
        log.write(out)
    if done.returncode != 0:
        reason = f"a --setup line failed (exit {done.returncode}); see {paths.logs / 'batch.out'}"
        raise SetupFailed(done.returncode, reason, log_tail(paths.logs / "batch.out"))
    env: dict[str, str] = {}
    for item in dump.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


__all__ = ["OWNER", "LocalBackend", "cancel_recorded", "make_local_dir", "run_setup"]
