"""Run a planned job as local processes (the `local` cluster), in the foreground."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from . import render, runs, shell
from .backends.local import LocalPlan, free_port, local_job_id, run_local
from .render import BatchPlan
from .spec import JobSpec


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


def run_local_job(
    spec: JobSpec,
    plan: BatchPlan,
    paths: runs.RunPaths,
    cwd: Path,
    environ: Mapping[str, str],
    out: TextIO,
    err: TextIO,
    as_json: bool,
) -> int:
    from .run import announce, index

    job_id = local_job_id()
    values = local_values(spec, job_id, environ)
    env = {"MASTER_ADDR": values["MASTER_ADDR"], "MASTER_PORT": values["MASTER_PORT"]}
    staging = bool(spec.stage or spec.stage_out)
    if staging:  # every local "node" is this machine: one node-local folder
        user = environ.get("USER") or "user"
        values["HPCLAUNCH_LOCAL"] = env["HPCLAUNCH_LOCAL"] = f"/tmp/{user}-hpclaunch-{job_id}"
    env.update(render.task_env_values(plan, spec, values))
    argv = tuple(shell.expand(w, {**values, **env}) for w in plan.task_argv)
    tasks = 1 if spec.launcher == "torchrun" else spec.tasks_per_node
    local = LocalPlan(
        task_argv=argv,
        nodes=spec.nodes,
        tasks_per_node=tasks,
        env=env,
        log_dir=paths.logs,
        job_name=spec.job_name,
        job_id=job_id,
        cpus_per_task=spec.cpus_per_task,
        cwd=cwd,
    )
    runs.update_record(paths.run_dir, job_id=str(job_id), state="RUNNING")
    index(paths, spec, str(job_id))
    announce(out, err, paths, spec, str(job_id), as_json, waiting=True, kind="local job")
    if staging:
        from . import stage_node

        stage_spec = render.stage_json(spec, paths)
        try:
            stage_node.prepare(stage_spec, env["HPCLAUNCH_LOCAL"], {**environ, **values})
        except OSError as exc:
            stage_node.finish({}, env["HPCLAUNCH_LOCAL"], "local")
            runs.update_record(paths.run_dir, state="FAILED", exit_code=1, ended_at=time.time())
            err.write(f"hpclaunch: staging failed: {exc}\n")
            return 1
    try:
        code = run_local(local, out, err)
    finally:
        if staging:
            stage_node.finish(stage_spec, env["HPCLAUNCH_LOCAL"], "local")
    state = "COMPLETED" if code == 0 else ("CANCELLED" if code == 130 else "FAILED")
    runs.update_record(paths.run_dir, state=state, exit_code=code, ended_at=time.time())
    return code
