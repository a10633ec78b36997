"""`hpclaunch attach`: a shell or a command on a node of a running job, inside the job's
own allocation, optionally inside the job's container.

The step is `srun --jobid=J --overlap --nodes=1 --ntasks=1 -w NODE [--pty] COMMAND`:
`--overlap` shares the CPUs, memory and GPUs the ranks hold (nothing new is allocated,
so it starts at once on a full node), `-w` picks the node. The job's node names come
from its ranks' `rank_start` events when every node has reported (no Slurm call),
else from one `squeue` and one `scontrol show hostnames`.

With `--container` the command enters the image exactly as the job's tasks did
(containers.wrap: the runtime, its binds and flags from spec.json, the environment
through a pipe to an exec-only bootstrap), so it sees the job's venv and variables.

The command runs with the run's own variables added (HPCLAUNCH_RUN_DIR, ..., the run's
public --env values); secrets were never recorded and come from the caller's environment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NoReturn, Optional

from hpclaunch.basics import states
from hpclaunch.config.jobspec import MASK, Bind, ContainerJob, is_secret
from hpclaunch.config.profilekinds import runs_here
from hpclaunch.errors import UserError, show
from hpclaunch.node import (
    ENV_FD_FLAG,
    EXEC_FLAG,
    HPCLAUNCH_CONTAINER_PASS,
    HPCLAUNCH_VENV,
    LOADER,
    PYTHON_FLAGS,
    RUN_DIR_NAME,
)
from hpclaunch.payload import containers, runtimes
from hpclaunch.records.runrecord import RunRecord
from hpclaunch.slurm import commands

SPEC = "spec.json"
# The image's Python starts the exec-only bootstrap, as it started the job's tasks (every
# built-in profile's `python`): inside the image the host's interpreter does not exist.
IMAGE_PYTHON = "python3"
# States in which the job waits for nodes (again, between two attempts of --requeue).
WAITING = frozenset(
    {
        states.State.PENDING,
        states.State.CONFIGURING,
        states.State.POWER_UP_NODE,
        states.State.REQUEUED,
        states.State.REQUEUE_FED,
        states.State.REQUEUE_HOLD,
        states.State.RESV_DEL_HOLD,
    }
)


@dataclass(frozen=True)
class Target:
    """Where the step goes: the run, the Slurm job srun joins, its nodes, the one picked."""

    run_id: str
    job_id: str
    nodes: tuple[str, ...]
    node: str


@dataclass(frozen=True)
class Plan:
    target: Target
    argv: tuple[str, ...]  # srun ... COMMAND
    env: dict[str, str]  # srun's environment (the step's, srun exports it all)
    pty: bool
    container: bool
    command: tuple[str, ...]  # what the user asked for; () = a shell


# --- which job, which node ---------------------------------------------------------------


def check_running(record: RunRecord) -> None:
    """A step can only join a job that holds nodes now: anything else in one line."""
    rid = record.run_id
    if runs_here(record.backend):
        raise UserError(
            "RUN",
            f"{rid} is a local run",
            "attach joins a Slurm job's allocation",
            "Its ranks run on this machine: use hpclaunch logs, or ps",
        )
    if not record.job_id:
        raise UserError("RUN", f"{rid} has no job", "it was never submitted", "")
    state = states.parse(record.state)
    if state == states.State.RUNNING:
        return
    see = f"See hpclaunch status {rid}"
    if record.state == states.State.CREATED or state in WAITING:
        between = " between two attempts (requeued)" if record.events.attempts else ""
        why = f", {record.reason}" if record.reason and record.reason != "None" else ""
        raise UserError(
            "RUN",
            f"{rid} is pending{between} ({record.state}{why})",
            "attach needs a running job: no node holds it yet",
            f"Attach once it runs. {see}",
        )
    if state in states.TERMINAL:
        raise UserError(
            "RUN",
            f"{rid} has already ended ({record.state})",
            "attach needs a running job",
            f"See hpclaunch logs {rid}",
        )
    raise UserError(
        "RUN", f"{rid} is {record.state}, not running", "attach needs a running job", see
    )


def job_to_join(record: RunRecord) -> str:
    """The Slurm job the ranks run in, which srun joins (`attach`, `stack`): a --requeue or
    --chain run's current attempt's; a sweep point's task by its own job id (srun refuses
    `ARRAY_TASK`), once Slurm or the point said it; else the recorded one."""
    attempts = record.events.attempts
    if attempts and attempts[-1].job_id:
        return attempts[-1].job_id
    job = str(record.job_id or "")
    if "_" in job:
        from hpclaunch.records import sweeprecord as sweep_record

        start = sweep_record.point_started(record.path, job) or {}
        return str(record.extra.get("slurm_job_id") or start.get("job_id") or job)
    return job


def nodes_from_events(record: RunRecord) -> list[str]:
    """The nodes the ranks reported from (this attempt's), rank 0's first; [] until every
    node of the job has reported one."""
    found: list[str] = []
    for _, node in sorted(record.events.started.items()):
        if node and node not in found:
            found.append(node)
    return found if record.nodes and len(found) >= record.nodes else []


def ask_slurm(job_id: str) -> tuple[str, list[str]]:
    """(the job's own id, its nodes): one squeue (%A: an array task's own id) and one
    scontrol to expand the node list."""
    out = commands.run(["squeue", "-h", "-j", job_id, "-o", "%A|%N"], timeout=30).strip()
    own, _, nodelist = out.splitlines()[0].partition("|") if out else (job_id, "", "")
    if not nodelist.strip():
        return own.strip() or job_id, []
    out = commands.run(["scontrol", "show", "hostnames", nodelist.strip()], timeout=30)
    return own.strip() or job_id, [line.strip() for line in out.splitlines() if line.strip()]


def pick_node(nodes: Sequence[str], wanted: Optional[str], run_id: str, job_id: str) -> str:
    if not nodes:
        raise UserError(
            "RUN",
            f"Slurm lists no nodes for job {job_id} of {run_id}",
            "it may have just ended",
            f"See hpclaunch status {run_id}",
        )
    if wanted is None:
        return nodes[0]
    if wanted not in nodes:
        raise UserError(
            "--node",
            f"{show(wanted)} is not a node of job {job_id}",
            f"its nodes: {', '.join(nodes)}",
            "Pick one of them",
        )
    return wanted


def find_target(record: RunRecord, wanted: Optional[str]) -> Target:
    """The record must be up to date (runstatus.refresh_one): its state decides."""
    check_running(record)
    job_id = job_to_join(record)
    nodes = nodes_from_events(record)
    if not nodes or not job_id.isdigit():
        job_id, nodes = ask_slurm(job_id)
    node = pick_node(nodes, wanted, record.run_id, job_id)
    return Target(record.run_id, job_id, tuple(nodes), node)


# --- what runs on the node ---------------------------------------------------------------


def sweep_dir(record: RunRecord) -> Optional[Path]:
    """A sweep point's folder is <sweep>/points/<i>; spec.json and the shipped files are
    the sweep's, one copy for every point."""
    return record.path.parent.parent if "sweep_id" in record.extra else None


def load_spec(record: RunRecord) -> dict[str, Any]:
    """spec.json of the run (of its sweep for a point); {} when there is none."""
    folder = sweep_dir(record) or record.path
    try:
        data = json.loads((folder / SPEC).read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def container_of(spec: Mapping[str, Any]) -> Optional[ContainerJob]:
    """The resolved container spec.json holds, as the ContainerJob the job was rendered from."""
    data = spec.get("container")
    if not isinstance(data, dict) or not data.get("image"):
        return None
    bind_keys = {f.name for f in fields(Bind)}
    binds = tuple(
        Bind(**{k: v for k, v in b.items() if k in bind_keys})
        for b in data.get("binds") or ()
        if isinstance(b, dict)
    )
    return ContainerJob(
        runtime=str(data.get("runtime", "")),
        command=str(data.get("command", "")),
        image=str(data["image"]),
        binds=binds,
        flags=tuple(str(f) for f in data.get("flags") or ()),
        activate=str(data.get("activate") or ""),
        cwd=str(data.get("cwd") or ""),
        pass_env=tuple(str(p) for p in data.get("pass_env") or ()),
    )


def job_cwd(record: RunRecord, job: Optional[ContainerJob]) -> str:
    """Where the job's tasks started (its code snapshot, usually): the step starts there."""
    if job is not None and job.cwd:
        return job.cwd
    code = record.code
    folder = sweep_dir(record)
    if folder is not None:
        from hpclaunch.records import sweeprecord as sweep_record

        try:
            code = sweep_record.load(folder).get("code") or {}
        except sweep_record.DamagedSweep:
            code = {}
    cwd = str(code.get("cwd") or record.cwd or "")
    return cwd if cwd and Path(cwd).is_dir() else ""


def run_env(record: RunRecord, spec: Mapping[str, Any]) -> dict[str, str]:
    """The run's own variables, as its tasks have them (the secrets were never recorded)."""
    env = {"HPCLAUNCH_RUN_DIR": record.run_dir, "HPCLAUNCH_RUN_ID": record.run_id}
    if record.checkpoint_dir:
        env["HPCLAUNCH_CHECKPOINT_DIR"] = record.checkpoint_dir
    given = spec.get("env")
    if isinstance(given, dict):
        env.update(
            {str(k): str(v) for k, v in given.items() if not is_secret(str(k)) and v != MASK}
        )
    return env


def step_env(environ: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """srun's environment: the caller's without SLURM_*/SRUN_* (from inside another
    allocation they describe that job, and srun would take them as this step's
    options), SLURM_CONF kept; then the run's variables."""
    env = {
        k: v
        for k, v in environ.items()
        if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SRUN_"))
    }
    env.update(extra)
    return env


def shell_argv(environ: Mapping[str, str], in_image: bool) -> list[str]:
    """The interactive shell: the user's login shell on the node; in the image plain
    bash (the user's shell may not exist there, and a login shell's /etc/profile would
    replace the PATH the job's tasks get, its venv first)."""
    if in_image:
        return ["bash"]
    return [environ.get("SHELL") or "bash", "-l"]


def in_container(
    job: ContainerJob, bootstrap: Path, command: Sequence[str], names: Sequence[str]
) -> tuple[list[str], dict[str, str]]:
    """The task line of the job's tasks with an exec-only bootstrap: it takes the
    environment from the pipe (the names the job passes, the run's, TERM), activates
    the venv, and becomes the command."""
    inner = [IMAGE_PYTHON, *PYTHON_FLAGS, str(bootstrap)]
    fd = containers.env_fd(job)  # Pyxis, the CE, podman-hpc: the environment crosses itself
    inner += [f"{ENV_FD_FLAG}{fd}"] if fd else []
    argv = containers.wrap(job, [*inner, EXEC_FLAG, *command], [*names, "TERM"])
    passed = containers.pass_list(job, [*names, "TERM"])
    return [str(w) for w in argv], {HPCLAUNCH_CONTAINER_PASS: passed}


def container_flags(job: Optional[ContainerJob], folder: Path, names: Sequence[str]) -> list[str]:
    """srun's options that enter the image (Pyxis's, the CE's EDF the job's folder holds)."""
    if job is None:
        return []
    flags = runtimes.srun_flags(job, [*names, "TERM"], str(folder / runtimes.EDF_NAME))
    return [str(flag) for flag in flags]  # no node-local folder here: plain words


def srun_argv(
    target: Target, pty: bool, cwd: str, command: Sequence[str], flags: Sequence[str] = ()
) -> list[str]:
    argv = [
        "srun",
        f"--jobid={target.job_id}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        "-w",
        target.node,
    ]
    if cwd:
        argv.append(f"--chdir={cwd}")
    if pty:
        argv.append("--pty")
    return [*argv, *flags, *command]


def plan_attach(
    record: RunRecord,
    target: Target,
    command: Sequence[str],
    *,
    container: bool,
    pty: bool,
    environ: Mapping[str, str],
    add_env: Optional[Mapping[str, str]] = None,
) -> Plan:
    """add_env: variables of this step only, passed into the image too (a session's
    server token, which must never be on a command line)."""
    spec = load_spec(record)
    job = container_of(spec)
    extra = {**run_env(record, spec), **(add_env or {})}
    venv = str(spec.get("venv") or "")
    wanted = list(command) or shell_argv(environ, in_image=container)
    flags: list[str] = []
    if container:
        if job is None:
            raise UserError(
                "--container",
                f"{record.run_id} runs without a container",
                "",
                "Attach without --container",
            )
        bootstrap = (sweep_dir(record) or record.path) / RUN_DIR_NAME[LOADER]
        if venv:
            extra[HPCLAUNCH_VENV] = venv  # the bootstrap activates it, as in the tasks
        names = [*extra, *(str(k) for k in spec.get("env") or {})]
        wanted, passing = in_container(job, bootstrap, wanted, names)
        extra.update(passing)
        if job.runtime == "ce":  # the EDF of a broadcast image names ${HPCLAUNCH_IMAGE}
            extra[runtimes.IMAGE_VAR] = job.image  # here: the shared file
        flags = container_flags(job, sweep_dir(record) or record.path, names)
    elif venv:
        # What `activate` does (the bootstrap does the same for the job's tasks).
        extra["VIRTUAL_ENV"] = venv
        extra["PATH"] = f"{venv}/bin:{environ.get('PATH', '/usr/bin:/bin')}"
    argv = srun_argv(target, pty, job_cwd(record, job), wanted, flags)
    env = step_env(environ, extra)
    return Plan(target, tuple(argv), env, pty, container, tuple(command))


# --- running it --------------------------------------------------------------------------


def become(p: Plan) -> NoReturn:
    """The interactive case: hpclaunch becomes srun (commands.become)."""
    commands.become(p.argv, p.env)


def call(p: Plan, capture: bool = False) -> tuple[int, str, str]:
    """srun as a child with hpclaunch's stdin (commands.attached)."""
    return commands.attached(p.argv, p.env, capture)
