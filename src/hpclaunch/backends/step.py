"""Inside an allocation (salloc, or an sbatch script): the run is one srun step of it,
in the foreground, its ranks' output streamed as --wait streams a batch job's."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Optional, TextIO

from hpclaunch import node
from hpclaunch.backends.base import Backend, Launch
from hpclaunch.backends.local import run_setup
from hpclaunch.backends.localsignals import SignalBox, stop_reason
from hpclaunch.backends.requests import DryRun
from hpclaunch.backends.stepsignals import DISABLE_STATUS, StepStop, kill_wait_s
from hpclaunch.basics import shell
from hpclaunch.basics.states import State
from hpclaunch.basics.users import with_user
from hpclaunch.config import secretnames
from hpclaunch.observe.jobend import JobStatus, exit_code_of, first_failure
from hpclaunch.observe.logs import LogFollower
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import gpu_watch_lines, render
from hpclaunch.slurm import commands, discover

_POLL_S = 0.2
_WATCH_STOP_S = 5.0


def step_env(launch: Launch) -> dict[str, str]:
    """The srun step's environment: the allocation's, plus what the batch script would
    export. MASTER_ADDR comes from the step's own node list (the bootstrap reads
    SLURM_STEP_NODELIST); the port is random so that steps of one job differ. --setup
    lines run first, here in the allocation's shell as in a batch script."""
    env = with_user(run_setup(launch.spec.setup, launch.environ, launch.cwd, launch.paths))
    return with_step_vars(launch, env, str(random.randint(12000, 19999)))


def with_step_vars(launch: Launch, env: dict[str, str], port: str) -> dict[str, str]:
    """`env` with what the batch script would export for the ranks (start and dry-run)."""
    env.pop("MASTER_ADDR", None)
    env["MASTER_PORT"] = port
    env[DISABLE_STATUS] = "1"  # a Ctrl-C reaches the ranks at once (stepsignals.py)
    if render.uses_local(launch.spec, list(launch.plan.task_env)):
        # As the batch script sets it: the bootstrap of each node's local rank 0 makes
        # the folder (private, an unpredictable name) and tells the node's other ranks.
        env[node.HPCLAUNCH_LOCAL] = node.LOCAL_UNSET
        env[node.HPCLAUNCH_LOCAL_PARENT] = env.get("SLURM_TMPDIR") or env.get("TMPDIR") or "/tmp"
        env[node.HPCLAUNCH_LOCAL_RECORD] = str(launch.paths.run_dir / node.LOCAL_RECORDS)
    env.update(render.task_env_values(launch.plan, launch.spec, env))
    return env


def step_dry_run(launch: Launch) -> DryRun[tuple[str, ...]]:
    """The srun line of the step and the variables it adds to this shell's environment."""
    base = with_user(dict(launch.environ))
    env = with_step_vars(launch, dict(base), "<random port>")
    added = {k: v for k, v in env.items() if base.get(k) != v}
    secrets = launch.spec.masked_secrets()
    added.update({name: "$" + name for name, _ in launch.spec.secret_env()})
    argv = tuple(shell.expand(w, env) for w in launch.plan.srun_argv)
    shown = secretnames.masked(list(argv), secrets)
    job = launch.environ.get("SLURM_JOB_ID", "?")
    text = [
        f"# Inside job {job}: no sbatch; the run is one step of this allocation, in the",
        "# foreground, from this shell's environment (after the --setup lines, run here) plus:",
        *(shell.export(k, v) for k, v in secretnames.masked(sorted(added.items()), secrets)),
        shell.join_multiline(shown[: len(shown) - len(launch.plan.task_argv)],
                             shown[len(shown) - len(launch.plan.task_argv):]),
    ]  # fmt: skip
    if launch.plan.watch_argv:
        text.append("# and the GPU watch, a step of its own a second later (stopped with them):")
        text.append(shell.comment("  " + shell.command(list(launch.plan.watch_argv))))
    data = {"srun": shown, "env": secretnames.masked(dict(sorted(added.items())), secrets)}
    return DryRun(argv, "\n".join(text) + "\n", data)


class StepBackend(Backend):
    name = "slurm"  # the record keeps the cluster's backend; `step: true` marks the kind
    kind = "step of job"
    foreground = True
    step_of_allocation = True

    def __init__(self) -> None:
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stopped_by: dict[str, int] = {}  # a step ended by a signal to hpclaunch
        self._watches: dict[str, GpuWatchStep] = {}
        self._grace_s: dict[str, float] = {}  # the site's KillWait, shown on a Ctrl-C

    def dry_run(self, launch: Launch) -> DryRun[tuple[str, ...]]:
        return step_dry_run(launch)

    def record_extra(self, job_id: str) -> dict[str, object]:
        return {"step": True}

    def start(self, launch: Launch) -> str:
        job_id = launch.environ["SLURM_JOB_ID"]
        env = step_env(launch)
        argv = [shell.expand(w, env) for w in launch.plan.srun_argv]
        self._grace_s[job_id] = kill_wait_s(discover.slurm_config())
        # A session of its own: a terminal's Ctrl-C reaches hpclaunch only, which hands
        # it on (stepsignals.StepStop), not srun as well (the ranks would get it twice).
        self._procs[job_id] = commands.start(argv, env, own_session=True)
        if launch.plan.watch_argv:
            self._watches[job_id] = GpuWatchStep(list(launch.plan.watch_argv), env)
        return job_id

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        found: dict[str, JobStatus] = {}
        for job_id in job_ids:
            proc = self._procs.get(job_id)
            if proc is None:
                continue
            rc = proc.poll()
            state = State.RUNNING if rc is None else (State.COMPLETED if rc == 0 else State.FAILED)
            found[job_id] = JobStatus(state, "", None if rc is None else f"{rc}:0")
        return found

    def cancel(self, job_id: str) -> None:
        if job_id in self._watches:
            self._watches[job_id].stop()
        proc = self._procs.get(job_id)
        if proc is not None and proc.poll() is None:
            # srun ends the step on SIGINT twice in a row; one TERM is enough to end it.
            proc.send_signal(signal.SIGTERM)

    def end_reason(self, job_id: str) -> str:
        signum = self._stopped_by.get(job_id)
        return "" if signum is None else stop_reason(signum)

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
        proc = self._procs[job_id]
        watch = self._watches.get(job_id)
        follower = LogFollower(paths.logs, out, err)
        deadline = None if timeout is None else time.monotonic() + timeout
        stop = StepStop(proc, self._grace_s.get(job_id, kill_wait_s(None)), err)
        box = SignalBox()  # Ctrl-C, SIGTERM, SIGHUP noted, handed to `stop` each tick
        box.hold()
        try:
            while proc.poll() is None:
                signum = box.take()
                if signum is not None:
                    stop.on_signal(signum)
                stop.tick()
                follower.poll()
                if watch is not None and stop.signum is None:
                    watch.start_when_due()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"step of job {job_id} still running")
                time.sleep(_POLL_S)
        finally:
            box.release()
        if stop.signum is not None:  # Ctrl-C 130, SIGTERM/SIGHUP 128+N (the table)
            self._stopped_by[job_id] = stop.signum
            if watch is not None:
                watch.stop()
            follower.drain()
            return 128 + stop.signum, State.CANCELLED.value
        if watch is not None:
            watch.stop()
        time.sleep(_POLL_S)
        follower.drain()
        rc = proc.returncode
        code = 0 if rc == 0 else (first_failure(paths.logs) or exit_code_of(rc))
        return code, State.COMPLETED.value if code == 0 else State.FAILED.value


class GpuWatchStep:
    """The GPU watch beside a step's ranks (gpu_watch_lines.py says why a step of its own): started
    a second after them, as the batch script does, stopped when they end."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv, self.env = argv, env
        self.due = time.monotonic() + gpu_watch_lines.START_DELAY_S
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.stopped = False

    def start_when_due(self) -> None:
        if self.proc is None and not self.stopped and time.monotonic() >= self.due:
            self.proc = commands.start(self.argv, self.env, own_session=True)

    def stop(self) -> None:
        """SIGUSR1 (srun passes it to the task), a few seconds to write the last samples,
        then SIGTERM (srun ends the step: its task had not started yet)."""
        self.stopped = True
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGUSR1)
        try:
            self.proc.wait(timeout=_WATCH_STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait()
