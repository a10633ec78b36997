"""The local backend: a planned run as processes on this machine, every "node" here,
with the same per-rank environment a Slurm step gives (localtasks.py).

Staged data goes into one node-local folder (every local node is this machine) before
the tasks start, and is copied out and removed when they end, as the staging guard does
on a cluster (it is the same code, node/stage_guard.py, run in-process).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional, TextIO

from .. import render, shell
from ..errors import HpclaunchError
from ..monitor import JobStatus
from ..node import stage_guard
from ..rundirs import RunPaths
from ..spec import JobSpec
from ..users import user_name, with_user
from .base import Backend, Launch
from .localtasks import LocalPlan, LocalTasks, free_port, local_job_id


def local_values(spec: JobSpec, job_id: int, environ: Mapping[str, str]) -> dict[str, str]:
    """What the batch shell would know, for expanding the plan's variable references."""
    values = dict(environ)
    values.update(
        {
            "SLURM_JOB_ID": str(job_id),
            "SLURM_NNODES": str(spec.nodes),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }
    )
    return values


@dataclass
class _Job:
    tasks: LocalTasks
    stage_spec: Optional[dict[str, Any]]
    local_dir: str
    code: Optional[int] = None
    state: str = "RUNNING"


class LocalBackend(Backend):
    name = "local"
    kind = "local job"
    foreground = True

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}

    def start(self, launch: Launch) -> str:
        spec, plan, paths = launch.spec, launch.plan, launch.paths
        job_id = local_job_id()
        values = local_values(spec, job_id, launch.environ)
        env = {"MASTER_ADDR": values["MASTER_ADDR"], "MASTER_PORT": values["MASTER_PORT"]}
        local_dir = ""
        if spec.stage or spec.stage_out:  # every local "node" is this machine: one folder
            local_dir = f"/tmp/{user_name(launch.environ)}-hpclaunch-{job_id}"
            values["HPCLAUNCH_LOCAL"] = env["HPCLAUNCH_LOCAL"] = local_dir
        env.update(render.task_env_values(plan, spec, values))
        argv = tuple(shell.expand(w, {**values, **env}) for w in plan.task_argv)
        tasks = LocalTasks(
            LocalPlan(
                task_argv=argv,
                nodes=spec.nodes,
                tasks_per_node=1 if spec.launcher == "torchrun" else spec.tasks_per_node,
                env=env,
                log_dir=paths.logs,
                job_name=spec.job_name,
                job_id=job_id,
                cpus_per_task=spec.cpus_per_task,
                cwd=launch.cwd,
                base_env=with_user(launch.environ),
            )
        )
        stage_spec = _stage_in(spec, paths, local_dir, {**launch.environ, **values})
        try:
            tasks.spawn()
        except BaseException:
            if stage_spec is not None:
                stage_guard.finish(stage_spec, local_dir, "local")
            raise
        self._jobs[str(job_id)] = _Job(tasks, stage_spec, local_dir)
        return str(job_id)

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        found: dict[str, JobStatus] = {}
        for job_id in job_ids:
            job = self._jobs.get(job_id)
            if job is None:
                continue
            state = job.state if job.code is not None or not job.tasks.running() else "RUNNING"
            found[job_id] = JobStatus(state, "", None)
        return found

    def cancel(self, job_id: str) -> None:
        job = self._jobs.get(job_id)
        if job is not None:
            job.tasks.cancel()

    def wait(
        self,
        job_id: str,
        paths: RunPaths,
        out: TextIO,
        err: TextIO,
        *,
        is_tty: bool = False,
        timeout: Optional[float] = None,
    ) -> tuple[int, str]:
        job = self._jobs[job_id]
        if job.code is not None:
            return job.code, job.state
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            code = job.tasks.supervise(out, err, deadline)
        except TimeoutError:
            raise
        except BaseException:
            self._finish_staging(job)
            raise
        self._finish_staging(job)
        if job.tasks.cancelled:
            code, state = 121, "CANCELLED"
        else:
            state = "COMPLETED" if code == 0 else ("CANCELLED" if code == 130 else "FAILED")
        job.code, job.state = code, state
        return code, state

    def _finish_staging(self, job: _Job) -> None:
        if job.stage_spec is not None:
            stage_guard.finish(job.stage_spec, job.local_dir, "local")
            job.stage_spec = None


def _stage_in(
    spec: JobSpec, paths: RunPaths, local_dir: str, environ: Mapping[str, str]
) -> Optional[dict[str, Any]]:
    """Unpack the staged data into the node-local folder; None when nothing is staged."""
    if not local_dir:
        return None
    stage_spec = render.stage_json(spec, paths)
    try:
        stage_guard.prepare(stage_spec, local_dir, environ)
    except OSError as exc:
        stage_guard.finish({}, local_dir, "local")
        raise HpclaunchError(f"staging failed: {exc}") from None
    return stage_spec
