"""Check a request against the cluster profile and build the JobSpec.

Every check raises UserError naming the field, the value, the limit and the fix,
so a bad request never waits hours in a queue (Slurm itself would often accept
it and leave it PENDING forever, e.g. a time over the partition's MaxTime).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, Optional

from .errors import UserError, show
from .profiles import Partition, Profile
from .shell import check_name
from .spec import JobSpec
from .topology import map_cpu_bind, mask_cpu_bind
from .units import format_memory, format_time, parse_memory

MAX_LOCAL_RANKS = 256
_EXP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# sbatch options hpclaunch models itself: passing them raw would contradict the plan.
_MODELED = {
    "-N": "-N/--nodes",
    "--nodes": "-N/--nodes",
    "-n": "--tasks-per-node",
    "--ntasks": "--tasks-per-node",
    "--ntasks-per-node": "--tasks-per-node",
    "-c": "--cpus-per-task",
    "--cpus-per-task": "--cpus-per-task",
    "--gpus-per-node": "--gpus-per-node",
    "-G": "--gpus-per-node",
    "--gpus": "--gpus-per-node",
    "--mem": "--mem",
    "--mem-per-gpu": "--mem-per-gpu",
    "-t": "-t/--time",
    "--time": "-t/--time",
    "-p": "-p/--partition",
    "--partition": "-p/--partition",
    "-A": "-A/--account",
    "--account": "-A/--account",
    "--reservation": "--reservation",
    "-J": "-J/--job-name",
    "--job-name": "-J/--job-name",
    "-o": "(hpclaunch's run directory)",
    "--output": "(hpclaunch's run directory)",
    "-e": "(hpclaunch's run directory)",
    "--error": "(hpclaunch's run directory)",
    "--exclusive": "--exclusive",
    "--wrap": "(the program after --)",
    "-D": "(the directory you run hpclaunch in)",
    "--chdir": "(the directory you run hpclaunch in)",
    "--open-mode": "(append, always)",
    "--parsable": "(hpclaunch reads the job id itself)",
}


_INTERPRETER = re.compile(r"^(python[0-9.]*|torchrun|bash|sh|uv|apptainer|singularity)$")


def default_job_name(program: tuple[str, ...]) -> str:
    """The script or module a user recognises: `python -u train.py` -> train.py,
    `python -m pkg.main` -> pkg.main, `./run.sh` -> run.sh."""
    name = PurePosixPath(program[0]).name
    if not _INTERPRETER.match(name):
        return name or "job"
    args = iter(program[1:])
    for arg in args:
        if arg == "-m":
            return next(args, name)
        if arg == "-c":
            return name
        if not arg.startswith("-"):
            return PurePosixPath(arg).name or name
    return name


def _positive(field: str, value: int, what: str) -> int:
    if value < 1:
        raise UserError(field, f"{value} {what}", "at least 1", f"Ask for 1 or more {what}")
    return value


def _text(field: str, value: str, *, allow_blank: bool = True) -> str:
    if any(c in value for c in "\n\r\x00"):
        raise UserError(field, f"{show(value)} holds a line break or NUL", "", "Remove it")
    if not allow_blank and any(c.isspace() for c in value):
        raise UserError(field, f"{show(value)} holds blanks", "", "Remove them")
    return value


def _program(program: tuple[str, ...]) -> tuple[str, ...]:
    if not program:
        raise UserError(
            "PROGRAM",
            "missing",
            "",
            "Put the program after --: hpclaunch run -N 2 -- python train.py",
        )
    for arg in program:
        if "\x00" in arg:
            raise UserError("argument", f"{show(arg)} holds a NUL byte", "", "Remove it")
    if program[0] == "":
        raise UserError("PROGRAM", "is empty", "", "Name the program after --")
    return program


def _env(items: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise UserError("--env", f"{show(item)} has no =", "", "Write KEY=VALUE")
        check_name(name)
        if "\x00" in value:
            raise UserError("--env", f"{name}'s value holds a NUL byte", "", "Remove it")
        pairs[name] = value
    return tuple(pairs.items())


def _sbatch_args(items: tuple[str, ...]) -> tuple[str, ...]:
    for item in items:
        _text("--sbatch-arg", item)
        if not item.startswith("-"):
            raise UserError(
                "--sbatch-arg",
                f"{show(item)} is not an option",
                "",
                "Write e.g. --sbatch-arg=--qos=high",
            )
        key = item.split("=", 1)[0]
        if not key.startswith("--"):
            key = key[:2]  # -N2, -t5: a short option with its value attached
        if key in _MODELED:
            raise UserError(
                "--sbatch-arg",
                f"{show(item)} is modelled by hpclaunch",
                "",
                f"hpclaunch sets it {_MODELED[key]}; drop it"
                if _MODELED[key].startswith("(")
                else f"Use hpclaunch's {_MODELED[key]} instead",
            )
    return items


def _partition(profile: Profile, name: str) -> Optional[Partition]:
    if not profile.partitions:
        return None
    part = profile.partition(name)
    if part is None:
        raise UserError(
            "--partition",
            f"unknown partition {show(name)} on {profile.name}",
            f"known: {', '.join(sorted(profile.partitions))}",
            "Pick one of them",
        )
    return part


def validate(
    profile: Profile,
    values: Mapping[str, Any],
    sources: Mapping[str, str],
    program: tuple[str, ...],
    environ: Mapping[str, str],
    in_allocation: bool,
    project: str = "",
) -> JobSpec:
    program = _program(program)
    local = profile.kind == "local"
    v = dict(values)

    partition_name = _text("--partition", str(v.get("partition") or ""), allow_blank=False)
    if not local and not in_allocation and not partition_name:
        partition_name = profile.default_partition_name()
    part = None if local or in_allocation else _partition(profile, partition_name)

    node_cpus = (part.cpus if part and part.cpus else None) or profile.node.cpus
    usable_cpus = profile.node.usable_cpus or node_cpus
    node_gpus = part.gpus if part and part.gpus is not None else profile.node.gpus
    node_mem = (part.memory_mb if part and part.memory_mb else None) or profile.node.memory_mb
    if local:
        node_cpus = usable_cpus = os.cpu_count() or 1

    nodes = _positive("--nodes", v.get("nodes", 1), "nodes")
    if part and part.max_nodes and nodes > part.max_nodes:
        raise UserError(
            "--nodes",
            f"{nodes} nodes on {partition_name}",
            f"the partition allows {part.max_nodes} per job",
            f"Ask for {part.max_nodes} or fewer",
        )
    if part and part.nodes and nodes > part.nodes:
        raise UserError(
            "--nodes",
            f"{nodes} nodes on {partition_name}",
            f"the partition has {part.nodes}",
            f"Ask for {part.nodes} or fewer",
        )

    whole = bool(part and part.whole_node)
    default_gpus = node_gpus if (whole and profile.one_task_per_gpu) else 0
    gpus = v.get("gpus_per_node", default_gpus)
    if gpus < 0:
        raise UserError("--gpus-per-node", f"{gpus}", "at least 0", "Ask for 0 or more GPUs")
    if gpus > node_gpus and not in_allocation:
        where = f"nodes of {partition_name}" if part else f"{profile.name} nodes"
        raise UserError(
            "--gpus-per-node",
            f"{gpus} GPUs per node",
            f"{where} have {node_gpus}",
            f"Ask for {node_gpus} or fewer" if node_gpus else "Drop --gpus-per-node",
        )

    tasks = _positive(
        "--tasks-per-node", v.get("tasks_per_node", gpus if gpus else 1), "tasks per node"
    )
    if local and nodes * tasks > MAX_LOCAL_RANKS:
        raise UserError(
            "--tasks-per-node",
            f"{nodes * tasks} local ranks",
            f"at most {MAX_LOCAL_RANKS}",
            "Use fewer nodes or tasks locally",
        )

    default_cpt = 1
    if profile.node.cpus_per_gpu and gpus and tasks == gpus:
        default_cpt = profile.node.cpus_per_gpu
    cpt = _positive("--cpus-per-task", v.get("cpus_per_task", default_cpt), "CPUs per task")
    launcher = v.get("launcher", profile.launcher)
    slurm_tasks = 1 if launcher == "torchrun" else tasks
    slurm_cpt = cpt * tasks if launcher == "torchrun" else cpt
    if not local and not in_allocation and usable_cpus and slurm_tasks * slurm_cpt > usable_cpus:
        raise UserError(
            "--cpus-per-task",
            f"{tasks} tasks x {cpt} CPUs = {tasks * cpt} per node",
            f"nodes have {usable_cpus} usable cores",
            f"Use at most {max(1, usable_cpus // tasks)} CPUs per task or fewer tasks",
        )

    mem, mem_per_gpu = v.get("mem"), v.get("mem_per_gpu")
    if mem is not None and mem_per_gpu is not None:
        raise UserError("--mem", "given together with --mem-per-gpu", "", "Give only one of them")
    if mem is None and mem_per_gpu is None and profile.mem_per_gpu and gpus and not local:
        mem_per_gpu = parse_memory(profile.mem_per_gpu, "mem_per_gpu")
    if node_mem and mem and mem > node_mem:
        raise UserError(
            "--mem",
            f"{format_memory(mem)} per node",
            f"nodes have {format_memory(node_mem)}",
            "Ask for less, or --mem 0 for all of it",
        )
    if node_mem and mem_per_gpu and gpus and mem_per_gpu * gpus > node_mem:
        raise UserError(
            "--mem-per-gpu",
            f"{format_memory(mem_per_gpu)} x {gpus} GPUs",
            f"nodes have {format_memory(node_mem)}",
            "Ask for less memory per GPU",
        )

    time_s = v.get("time")
    if part and part.max_time and time_s and time_s > part.max_time:
        raise UserError(
            "--time",
            f"{format_time(time_s)} on {partition_name}",
            f"the partition's limit is {format_time(part.max_time)}",
            f"Ask for {format_time(part.max_time)} or less, or pick another partition",
        )

    account = _text("--account", str(v.get("account") or ""), allow_blank=False)
    if profile.account_required and not account and not local:
        raise UserError(
            "--account",
            f"missing on {profile.name}",
            "every job needs a project account",
            "Give -A project_NNNNNNNNN or export SBATCH_ACCOUNT",
        )
    if account and profile.account_pattern and not re.match(profile.account_pattern, account):
        raise UserError(
            "--account",
            f"{show(account)} does not look like an account on {profile.name}",
            f"pattern {profile.account_pattern}",
            "Give e.g. -A project_465000000",
        )

    job_name = _text("--job-name", str(v.get("job_name") or default_job_name(program)))
    if len(job_name) > 200:
        raise UserError("--job-name", f"{len(job_name)} characters", "at most 200", "Shorten it")
    if '"' in job_name or "\\" in job_name:
        raise UserError(
            "--job-name", f"{show(job_name)} holds a quote or backslash", "", "Remove it"
        )
    exp = str(v.get("exp") or "default")
    if not _EXP.match(exp):
        raise UserError(
            "--exp",
            f"{show(exp)} is not a usable folder name",
            "letters, digits, . _ -; at most 100",
            "Rename the experiment",
        )
    setup = tuple(_text("--setup", line) for line in v.get("setup", ()) + profile.setup)

    cpu_bind = ""
    exclusive = bool(v.get("exclusive", False))
    topo = profile.topology
    if (
        topo is not None
        and profile.cpu_bind != "none"
        and launcher == "srun"
        and (whole or exclusive)
        and tasks == topo.gpus
        and not local
    ):
        verbose = profile.cpu_bind_verbose
        cpu_bind = (
            mask_cpu_bind(topo, verbose)
            if profile.cpu_bind == "mask"
            else map_cpu_bind(topo, verbose)
        )

    fmt = {
        "account": account or "noaccount",
        "user": environ.get("USER", "user"),
        "project": project,
        "scratch": environ.get("SCRATCH", ""),
    }
    root = profile.scratch_run_root if fmt["scratch"] and profile.scratch_run_root else ""
    run_root = str(v.get("run_root") or (root or profile.run_root).format(**fmt))
    ckpt_root = profile.checkpoint_root.format(**fmt) if profile.checkpoint_root else ""

    return JobSpec(
        cluster=profile.name,
        program=program,
        nodes=nodes,
        tasks_per_node=tasks,
        gpus_per_node=gpus,
        cpus_per_task=cpt,
        mem_mb=mem,
        mem_per_gpu_mb=mem_per_gpu,
        time_s=time_s,
        partition=partition_name,
        account=account,
        reservation=_text("--reservation", str(v.get("reservation") or ""), allow_blank=False),
        exclusive=exclusive,
        job_name=job_name,
        launcher=launcher,
        gpu_visibility=v.get("gpu_visibility", profile.gpu_visibility),
        exp=exp,
        project=project,
        env=_env(v.get("env", ())),
        setup=setup,
        sbatch_args=_sbatch_args(v.get("sbatch_arg", ())),
        run_root=run_root,
        checkpoint_root=ckpt_root,
        nccl_debug=bool(v.get("nccl_debug", False)),
        cpu_bind=cpu_bind,
        sources=tuple(sorted(sources.items())),
    )
