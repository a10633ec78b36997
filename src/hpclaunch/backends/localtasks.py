"""The local backend: one `srun` step emulated on this machine.

Every task gets the SLURM_* variables a real step gives it, so the bootstrap and
programs that detect Slurm themselves behave as on a cluster. Like srun with
--kill-on-bad-exit, the first task that fails ends the others; unlike srun there is no
cgroup, so each task runs in its own process group and the groups are what get signalled
(a program that starts its own session escapes that, as it would escape srun's signals).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from hpclaunch.backends.localreaper import Reaper
from hpclaunch.backends.localsignals import KILL_GRACE_S, SignalBox, Stopped, waiting_line
from hpclaunch.node import HPCLAUNCH_NODE_LABEL
from hpclaunch.node.stage_guard import signals_held  # the same guard the staging tars start under
from hpclaunch.observe.jobend import exit_code_of, first_failure
from hpclaunch.observe.logs import LogFollower

_TICK_S = 0.1  # how often task states and logs are looked at
_SETTLE_S = 1.0  # how long SIGKILLed groups may take to disappear

# Each task starts as this tiny program, which learns its own pid (SLURM_TASK_PID must be
# set before exec, when Popen cannot know the pid yet) and replaces itself with the task:
# same pid, same process group, no shell.
_EXEC_TASK = """\
import os, sys
os.environ["SLURM_TASK_PID"] = str(os.getpid())
try:
    os.execvp(sys.argv[1], sys.argv[1:])
except OSError as e:
    sys.stderr.write("hpclaunch: cannot run %r: %s\\n" % (sys.argv[1], e.strerror))
    sys.exit(127 if isinstance(e, FileNotFoundError) else 126)
"""


@dataclass(frozen=True)
class LocalPlan:
    task_argv: tuple[str, ...]
    nodes: int
    tasks_per_node: int
    env: Mapping[str, str]
    log_dir: Path
    job_name: str
    job_id: int
    cpus_per_task: int
    cwd: Path
    kill_grace_s: float = KILL_GRACE_S
    # The environment the tasks start from (the requester's, never read here from
    # os.environ): SLURM_* of an outer allocation are dropped from it.
    base_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.task_argv:
            raise ValueError("LocalPlan.task_argv is empty")
        if self.nodes < 1 or self.tasks_per_node < 1 or self.cpus_per_task < 1:
            raise ValueError("LocalPlan: nodes, tasks_per_node and cpus_per_task must be >= 1")

    @property
    def ntasks(self) -> int:
        return self.nodes * self.tasks_per_node


def free_port() -> int:
    """A TCP port nobody listens on right now (racy by nature; fine for one local run)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


_issued: list[int] = []  # the ids this process handed out (a local sweep starts several)
_issuing = threading.Lock()


def local_job_id() -> int:
    """A job id for a local run: two runs started at once (different pids) or one after
    the other (different milliseconds) get different ids, and so do runs this process
    starts in the same millisecond (the points of a local sweep, whose MASTER_PORT comes
    from it); below 2**31 like Slurm's."""
    ms = time.time_ns() // 1_000_000
    job_id = (os.getpid() * 1_000_003 + ms) % (2**31 - 1) or 1
    with _issuing:
        while job_id in _issued:
            job_id = job_id % (2**31 - 2) + 1
        _issued.append(job_id)
    return job_id


def short_hostname() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def _per_node(count: int, nodes: int) -> str:
    """Slurm's compressed per-node list: `4` on one node, `4(x3)` on three."""
    return str(count) if nodes == 1 else f"{count}(x{nodes})"


def step_env(plan: LocalPlan, task: int, host: str | None = None) -> dict[str, str]:
    """The full environment of task `task` (block distribution: node = task // per node).

    SLURM_TASK_PID is added by the task itself at start. SLURM_* inherited from the caller
    (hpclaunch started inside an allocation) are dropped: a mix of the outer job's and
    this step's variables would mislead the bootstrap.
    """
    host = host or short_hostname()
    node = task // plan.tasks_per_node
    env = {k: v for k, v in plan.base_env.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    env.update(plan.env)
    nodelist = ",".join([host] * plan.nodes)
    tasks_per_node = _per_node(plan.tasks_per_node, plan.nodes)
    first_on_node = node * plan.tasks_per_node
    env.update(
        {
            "SLURM_JOB_ID": str(plan.job_id),
            "SLURM_JOBID": str(plan.job_id),
            "SLURM_STEP_ID": "0",
            "SLURM_STEPID": "0",
            "SLURM_PROCID": str(task),
            "SLURM_LOCALID": str(task % plan.tasks_per_node),
            "SLURM_NODEID": str(node),
            "SLURM_NTASKS": str(plan.ntasks),
            "SLURM_NPROCS": str(plan.ntasks),
            "SLURM_NNODES": str(plan.nodes),
            "SLURM_JOB_NUM_NODES": str(plan.nodes),
            "SLURM_STEP_NUM_NODES": str(plan.nodes),
            "SLURM_STEP_NUM_TASKS": str(plan.ntasks),
            "SLURM_NTASKS_PER_NODE": str(plan.tasks_per_node),
            "SLURM_TASKS_PER_NODE": tasks_per_node,
            "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
            "SLURM_GTIDS": ",".join(
                str(t) for t in range(first_on_node, first_on_node + plan.tasks_per_node)
            ),
            "SLURM_JOB_NODELIST": nodelist,
            "SLURM_NODELIST": nodelist,
            "SLURM_STEP_NODELIST": nodelist,
            "SLURMD_NODENAME": host,
            "SLURM_SUBMIT_HOST": host,
            "SLURM_CPUS_PER_TASK": str(plan.cpus_per_task),
            "SLURM_CPUS_ON_NODE": str(plan.cpus_per_task * plan.tasks_per_node),
            "SLURM_JOB_CPUS_PER_NODE": _per_node(
                plan.cpus_per_task * plan.tasks_per_node, plan.nodes
            ),
            "SLURM_JOB_NAME": plan.job_name,
            "SLURM_SUBMIT_DIR": str(plan.cwd),
            "SLURM_CLUSTER_NAME": "local",
        }
    )
    if plan.nodes > 1:  # every node is this host: logs tag the simulated one (bootstrap)
        env[HPCLAUNCH_NODE_LABEL] = f"{host}/node{node}"
    return env


def _signal_groups(groups: list[int], sig: int) -> None:
    for pgid in groups:
        # Gone meanwhile (PermissionError: macOS answers so for a group of zombies).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def _alive(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """Process groups that still have a member (reaping the task leaders first)."""
    left = []
    for p in procs:
        p.poll()
        try:
            os.killpg(p.pid, 0)
            left.append(p.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return left


def _stop(
    procs: list[subprocess.Popen[bytes]],
    grace: float,
    follower: LogFollower | None,
    box: SignalBox | None = None,
) -> None:
    """SIGTERM every group, SIGKILL what is left after `grace` (at once on another
    signal in `box`: a second Ctrl-C), reap every task.

    Also runs after a clean end: processes a task left behind in its group (a daemon, a
    stray data loader worker) are ended, as slurmstepd ends them with the step.
    """
    groups = _alive(procs)
    if groups:
        _signal_groups(groups, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while groups and time.monotonic() < deadline:
            if box is not None and box.take() is not None:
                break  # impatience: a second Ctrl-C skips the grace period
            if follower is not None:
                follower.poll()  # the tasks' last words (tracebacks) show while we wait
            time.sleep(_TICK_S)
            groups = _alive(procs)
        killed = _alive(procs)
        _signal_groups(killed, signal.SIGKILL)
        # SIGKILL lands asynchronously and only the task leaders are ours to reap: give
        # the rest of each group a moment to be gone before saying the run has ended
        # (bounded: an init that never reaps keeps zombies in a group for good).
        settle = time.monotonic() + _SETTLE_S
        while killed and time.monotonic() < settle:
            time.sleep(0.02)
            killed = _alive(procs)
    for p in procs:
        p.wait()


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


class _TimeLimit(Exception):
    """The run's -t/--time passed: end it as Slurm ends a job at its limit (TIMEOUT)."""


def _supervise(
    procs: list[subprocess.Popen[bytes]],
    follower: LogFollower,
    err: TextIO,
    box: SignalBox,
    deadline: float | None = None,
    limit: float | None = None,
) -> int | None:
    """Stream logs until every task ended (None) or one failed (its return code).
    TimeoutError at `deadline` (the caller stops waiting), _TimeLimit at `limit`,
    Stopped on a signal noted in `box`."""
    running = list(range(len(procs)))
    while running:
        signum = box.take()
        if signum is not None:
            raise Stopped(signum)
        now = time.monotonic()
        if deadline is not None and now > deadline:
            raise TimeoutError("local tasks still running")
        if limit is not None and now > limit:
            raise _TimeLimit()
        for t in list(running):
            rc = procs[t].poll()
            if rc is None:
                continue
            running.remove(t)
            if rc != 0:
                follower.poll()
                if running:
                    err.write(f"hpclaunch: task {t} {_describe(rc)}; ending the other tasks\n")
                    err.flush()
                return rc
        follower.poll()
        if running:
            time.sleep(_TICK_S)
    return None


EXIT_TIMEOUT = 124  # as `hpclaunch run --wait` reports Slurm's TIMEOUT


class LocalTasks:
    """One emulated step: its tasks started (`spawn`), then watched (`supervise`) until
    they end, one fails (the others are ended, like srun --kill-on-bad-exit), the time
    limit passes, the caller is interrupted, or `cancel` ends them. No task process
    outlives `supervise`, except when it gives up waiting at a deadline (TimeoutError:
    the tasks go on). A reaper, when given, ends them if this process dies first.
    With `attached` (the caller supervises next, as `hpclaunch run` does), a Ctrl-C or
    SIGTERM from the spawn on is noted for `supervise`, never raised in between."""

    def __init__(
        self,
        plan: LocalPlan,
        reaper: Reaper | None = None,
        time_limit_s: float | None = None,
        attached: bool = False,
    ) -> None:
        self.plan = plan
        self.procs: list[subprocess.Popen[bytes]] = []
        self.cancelled = False
        self.timed_out = False
        self.stopped_by: int | None = None  # the signal (N) that ended it: code 128+N
        self._reaper = reaper
        self._limit = None if time_limit_s is None else time.monotonic() + time_limit_s
        self._attached = attached
        self._box = SignalBox()

    def spawn(self) -> None:
        if self._attached:
            self._box.hold()
        self.plan.log_dir.mkdir(parents=True, exist_ok=True)
        host = short_hostname()
        python = sys.executable or "python3"
        try:
            for task in range(self.plan.ntasks):
                # Held: a SIGTERM or Ctrl-C raising inside Popen (after the fork) left a
                # rank that nobody tracked, running on after hpclaunch had ended.
                with signals_held():
                    proc = subprocess.Popen(
                        [python, "-I", "-S", "-c", _EXEC_TASK, *self.plan.task_argv],
                        env=step_env(self.plan, task, host),
                        cwd=self.plan.cwd,
                        stdin=subprocess.DEVNULL,  # as in a batch job
                        start_new_session=True,
                    )
                    self.procs.append(proc)
                    if self._reaper is not None:
                        self._reaper.watch(proc.pid)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Start failed or was interrupted: end what started, let the reaper go."""
        _stop(self.procs, 0.0, None)
        self._close_reaper()
        self.release()

    @property
    def pgids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def cancel(self) -> None:
        """SIGTERM every task's process group; `supervise` ends what is left."""
        self.cancelled = True
        _signal_groups(_alive(self.procs), signal.SIGTERM)

    def interrupt(self, signum: int = signal.SIGINT) -> None:
        """End the step as a Ctrl-C (or signal `signum`) to hpclaunch would, from any
        thread: a local sweep's runner passes its Ctrl-C on to each running point."""
        self._box.pending.append(signum)

    def release(self) -> None:
        self._box.release()  # the caller's signal handlers back

    def supervise(
        self, out: TextIO, err: TextIO, deadline: float | None = None, keep_held: bool = False
    ) -> int:
        """Stream the tasks' logs until the step ends; its exit code: 0 when every task
        succeeded; else the first failing rank's code from its exit file (or the first
        failed task's return code, signal N -> 128+N); 124 at the time limit; 130 on
        Ctrl-C, 128+N on SIGTERM/SIGHUP (a second one ends the ranks at once). With
        `keep_held`, signals are noted (and dropped) until `release`."""
        follower = LogFollower(self.plan.log_dir, out, err)
        failed: int | None = None
        self._box.hold()
        try:
            try:
                failed = _supervise(self.procs, follower, err, self._box, deadline, self._limit)
            except TimeoutError:
                follower.poll()
                raise
            except _TimeLimit:
                self.timed_out = True
            except Stopped as stop:
                self.stopped_by = stop.signum
                err.write(waiting_line(stop.signum, self.plan.kill_grace_s))
                err.flush()
            _stop(self.procs, self.plan.kill_grace_s, follower, self._box)
            follower.drain()
        except BaseException:
            self.release()
            raise
        if not keep_held:
            self.release()
        self._close_reaper()
        if self.timed_out:
            return EXIT_TIMEOUT
        if self.stopped_by is not None:
            return 128 + self.stopped_by
        if failed is None:
            return 0
        rank_code = first_failure(self.plan.log_dir)
        return rank_code if rank_code is not None else exit_code_of(failed)

    def _close_reaper(self) -> None:
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None
