"""Inside an allocation (salloc, or an sbatch script): run the job as one srun step of it,
in the foreground, streaming the ranks' output like --wait does."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Mapping
from typing import TextIO

from . import render, runs, shell
from .backends import slurm
from .logs import LogFollower
from .monitor import exit_code_of, first_failure
from .render import BatchPlan
from .spec import JobSpec

_POLL_S = 0.2


def run_step_job(
    spec: JobSpec,
    plan: BatchPlan,
    paths: runs.RunPaths,
    environ: Mapping[str, str],
    out: TextIO,
    err: TextIO,
    as_json: bool,
) -> int:
    from .run import announce, index

    job_id = environ["SLURM_JOB_ID"]
    values = dict(environ)
    # MASTER_ADDR comes from the step's own node list (the bootstrap reads
    # SLURM_STEP_NODELIST); the port is random so that steps of one job differ.
    values.pop("MASTER_ADDR", None)
    values["MASTER_PORT"] = str(random.randint(12000, 19999))
    env = dict(environ)
    env.pop("MASTER_ADDR", None)
    env["MASTER_PORT"] = values["MASTER_PORT"]
    env.update(render.task_env_values(plan, spec, values))
    argv = [shell.expand(w, env) for w in plan.srun_argv]

    runs.update_record(paths.run_dir, job_id=job_id, state="RUNNING", step=True)
    index(paths, spec, job_id)
    announce(out, err, paths, spec, job_id, as_json, waiting=True, kind="step of job", step=True)

    follower = LogFollower(paths.logs, out, err)
    proc = slurm.run_step(argv, env)
    try:
        while proc.poll() is None:
            follower.poll()
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        # srun ends the step on SIGINT twice in a row; one TERM is enough to end it.
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        follower.drain()
        runs.update_record(paths.run_dir, state="CANCELLED", exit_code=130)
        return 130
    time.sleep(_POLL_S)
    follower.drain()
    rc = proc.returncode
    code = 0 if rc == 0 else (first_failure(paths.logs) or exit_code_of(rc))
    runs.update_record(
        paths.run_dir,
        state="COMPLETED" if code == 0 else "FAILED",
        exit_code=code,
        ended_at=time.time(),
    )
    return code
