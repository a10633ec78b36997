"""The local backend's plan: what `hpclaunch run --cluster local` will run, rank by rank.

local_plan makes the ranks' commands and variables for the start (local.py) and for the
dry-run alike (with localtasks.step_env), so that
the preview is the run: every rank's command and the variables hpclaunch sets for it on
top of the requester's environment. What only the start knows is shown as <...>; the
--setup lines are not run (their output and their changes to the environment come at
the start); secret values appear only as $NAME.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpclaunch.backends.base import Launch
from hpclaunch.backends.localtasks import LocalPlan, free_port, short_hostname, step_env
from hpclaunch.backends.requests import DryRun
from hpclaunch.basics import shell
from hpclaunch.basics.users import with_user
from hpclaunch.config import secretnames
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.node import HPCLAUNCH_NODE_LABEL
from hpclaunch.script import render

JOB_ID = "<job id>"  # local_job_id(), drawn at the start
PORT = "<free port>"  # free_port(), found at the start
LOCAL_DIR = "<node-local folder>"  # make_local_dir(), made at the start
_JOB_ID_VARS = ("SLURM_JOB_ID", "SLURM_JOBID")


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


def local_plan(
    launch: Launch,
    job_id: int,
    base: Mapping[str, str],
    values: dict[str, str],
    local_dir: str,
) -> LocalPlan:
    """The ranks of `launch` as local processes (start() and the dry-run alike): their
    command and the variables set on top of `base`, expanded with `values` (what the
    batch shell would know: local_values)."""
    spec, plan = launch.spec, launch.plan
    env = {"MASTER_ADDR": values["MASTER_ADDR"], "MASTER_PORT": values["MASTER_PORT"]}
    if local_dir:
        values["HPCLAUNCH_LOCAL"] = env["HPCLAUNCH_LOCAL"] = local_dir
    env.update(render.task_env_values(plan, spec, values))
    return LocalPlan(
        task_argv=tuple(shell.expand(w, {**values, **env}) for w in plan.task_argv),
        nodes=spec.nodes,
        tasks_per_node=1 if spec.launcher == "torchrun" else spec.tasks_per_node,
        env=env,
        log_dir=launch.paths.logs,
        job_name=spec.job_name,
        job_id=job_id,
        cpus_per_task=spec.cpus_per_task,
        cwd=launch.cwd,
        base_env=base,
    )


def local_dry_run(launch: Launch) -> DryRun[LocalPlan]:
    spec = launch.spec
    base = with_user(dict(launch.environ))
    values = local_values(spec, 0, base)
    values.update({"SLURM_JOB_ID": JOB_ID, "MASTER_PORT": PORT})
    local_dir = LOCAL_DIR if render.uses_local(spec, list(launch.plan.task_env)) else ""
    plan = local_plan(launch, 0, base, values, local_dir)
    secrets = spec.masked_secrets()
    host = short_hostname()
    ranks = [_rank(plan, task, base, secrets, host) for task in range(plan.ntasks)]
    data = {
        "cwd": str(plan.cwd),
        "logs": str(plan.log_dir),
        "inherits": "the requester's environment, without SLURM_* (after the --setup lines)",
        "setup": secretnames.masked(list(spec.setup), secrets),
        "ranks": ranks,
    }
    return DryRun(plan, _text(launch, plan, ranks), data)


def _rank(
    plan: LocalPlan, task: int, base: dict[str, str], secrets: list[tuple[str, str]], host: str
) -> dict[str, Any]:
    """One rank: where it is, its command, the variables set for it (secrets as $NAME)."""
    full = step_env(plan, task, host)
    full.pop(
        HPCLAUNCH_NODE_LABEL, None
    )  # the bootstrap's own: it takes it, the program never sees it
    env = {k: v for k, v in full.items() if base.get(k) != v}
    env.update({name: JOB_ID for name in _JOB_ID_VARS})
    env["SLURM_TASK_PID"] = "<its pid>"  # set by the task itself, before it execs
    # A secret reaches the ranks (named, so that the preview says so), never its value.
    env.update({name: "$" + name for name, _ in secrets if name in full})
    return {
        "rank": task,
        "node": task // plan.tasks_per_node,
        "local_rank": task % plan.tasks_per_node,
        "argv": secretnames.masked(list(plan.task_argv), secrets),
        "env": secretnames.masked(dict(sorted(env.items())), secrets),
    }


def _text(launch: Launch, plan: LocalPlan, ranks: list[dict[str, Any]]) -> str:
    """The variables every rank shares once, then each rank's own and its command."""
    spec = launch.spec
    shared = {k: v for k, v in ranks[0]["env"].items() if all(r["env"].get(k) == v for r in ranks)}
    shape = f"{plan.nodes} node(s) x {plan.tasks_per_node} task(s)"
    out = [
        f"# --cluster {spec.cluster}: no sbatch; hpclaunch runs {plan.ntasks} rank(s) ({shape}) "
        "as processes on this machine,",
        f"# each in its own process group, in {plan.cwd}, logs in {plan.log_dir}.",
        "# Each starts from your environment (SLURM_* of an outer allocation dropped) plus",
        "# the variables below; <...> is known only when the run starts.",
    ]
    if spec.setup:
        out.append("# Your --setup lines run first, through bash; what they set reaches the ranks:")
        secrets = spec.masked_secrets()
        out += [shell.comment("  " + secretnames.mask_text(line, secrets)) for line in spec.setup]
    out.append("# every rank:")
    out += [shell.export(k, v) for k, v in shared.items()]
    for rank in ranks:
        own = [f"{k}={v}" for k, v in rank["env"].items() if k not in shared]
        out.append(f"# rank {rank['rank']} (node {rank['node']}, local rank {rank['local_rank']}):")
        out.append(shell.join_multiline(["env", *own], rank["argv"]) if own else
                   shell.command(rank["argv"]))  # fmt: skip
    if spec.container:
        out += render.container_comment(spec, list(launch.plan.task_argv))
    return "\n".join(out) + "\n"
