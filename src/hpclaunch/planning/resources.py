"""Resource checks: nodes, GPUs, tasks, CPUs per task, memory and time, against the
chosen partition and the node shape (or, locally, this machine and the rank limit).

When a limit breaks because of a product (nodes x tasks, tasks x CPUs), the error
names the factor the user gave, found in `sources` (which layer gave each value): an
error about an option the user never typed sends them looking in the wrong place.
The batch script says, in comments, what a request that left something out got (GPUs
per node, the time limit) and how to ask for something else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from hpclaunch.basics.units import format_memory, format_time, parse_memory
from hpclaunch.config.options import RunOptions
from hpclaunch.config.profiles import Partition, Profile, gpus_on_node
from hpclaunch.config.projectfile import PROJECT_FILE
from hpclaunch.config.topology import local_gpus
from hpclaunch.errors import UserError

MAX_LOCAL_RANKS = 256


@dataclass(frozen=True)
class Resources:
    """The checked per-job sizes that go into the JobSpec."""

    nodes: int
    gpus_per_node: int
    tasks_per_node: int
    cpus_per_task: int
    mem_mb: Optional[int]
    mem_per_gpu_mb: Optional[int]
    time_s: Optional[int]


@dataclass(frozen=True)
class ResourceRequest:
    """One request and where it goes: what every check reads."""

    profile: Profile
    part: Optional[Partition]  # None: local, inside an allocation, or no partitions known
    partition_name: str
    options: RunOptions
    sources: Mapping[str, str]
    local: bool
    in_allocation: bool

    @property
    def submitted(self) -> bool:
        """A new Slurm job, whose sizes the partition's nodes must hold."""
        return not self.local and not self.in_allocation

    @property
    def whole_node(self) -> bool:
        return bool(self.part and self.part.whole_node)

    @property
    def exclusive(self) -> bool:
        return self.options.exclusive


def check_resources(req: ResourceRequest) -> Resources:
    """Every size checked, in the order a user fixes them: nodes, GPUs, tasks, CPUs,
    memory, time (the first broken one is the one reported)."""
    node_gpus = _node_gpus(req)
    nodes = _nodes(req)
    gpus = _gpus_per_node(req, node_gpus)
    tasks = positive(
        "--tasks-per-node", _given(req.options.tasks_per_node, gpus or 1), "tasks per node"
    )
    if req.local:
        _check_local_ranks(nodes, tasks, req.sources)
    cpus = _cpus_per_task(req, gpus, tasks)
    if req.options.overcommit and not req.local:
        _check_overcommit(req, tasks)
    elif req.submitted:
        _check_cpus_per_node(tasks, cpus, _usable_cpus(req), req.sources)
    mem, mem_per_gpu = _memory(req, gpus)
    return Resources(
        nodes=nodes,
        gpus_per_node=gpus,
        tasks_per_node=tasks,
        cpus_per_task=cpus,
        mem_mb=mem,
        mem_per_gpu_mb=mem_per_gpu,
        time_s=_time(req),
    )


def _given(value: Optional[int], default: int) -> int:
    return default if value is None else value


def positive(field: str, value: int, what: str) -> int:
    if value < 1:
        raise UserError(field, f"{value} {what}", "at least 1", f"Ask for 1 or more {what}")
    return value


# -- what one node offers (a partition's own shape wins over the profile's node) ------


def _usable_cpus(req: ResourceRequest) -> Optional[int]:
    part_cpus = req.part.cpus if req.part and req.part.cpus else None
    return req.profile.node.usable_cpus or part_cpus or req.profile.node.cpus


def _node_gpus(req: ResourceRequest) -> int:
    if req.local and not req.in_allocation and req.options.gpus_per_node:
        # The local profile knows no GPUs; a run here that asks for some (often through
        # the project file's gpus-per-node, meant for the cluster) counts this machine's.
        return max(gpus_on_node(req.profile, req.part), local_gpus())
    return gpus_on_node(req.profile, req.part)


def _node_memory(req: ResourceRequest) -> Optional[int]:
    part_mem = req.part.memory_mb if req.part and req.part.memory_mb else None
    return part_mem or req.profile.node.memory_mb


# -- the checks -----------------------------------------------------------------------


def _nodes(req: ResourceRequest) -> int:
    nodes = positive("--nodes", _given(req.options.nodes, 1), "nodes")
    part, name = req.part, req.partition_name
    if part and part.max_nodes and nodes > part.max_nodes:
        raise UserError(
            "--nodes",
            f"{nodes} nodes on {name}",
            f"the partition allows {part.max_nodes} per job",
            f"Ask for {part.max_nodes} or fewer",
        )
    if part and part.nodes and nodes > part.nodes:
        raise UserError(
            "--nodes",
            f"{nodes} nodes on {name}",
            f"the partition has {part.nodes}",
            f"Ask for {part.nodes} or fewer",
        )
    return nodes


def default_gpus(
    profile: Profile, part: Optional[Partition], exclusive: bool, node_gpus: int
) -> int:
    """GPUs per node when --gpus-per-node is not given. On one-task-per-GPU sites (LUMI)
    every job on a partition is a GPU job: all of a node the job owns (a whole-node
    partition, or --exclusive), else the partition's `gpus_default` (LUMI's partial-node
    partitions: 1), else 1. Elsewhere the partition's `gpus_default`, else none. Without
    a partition (local, inside an allocation) none."""
    if part is None:
        return 0
    if profile.one_task_per_gpu and (part.whole_node or exclusive):
        return node_gpus
    if part.gpus_default is not None:
        return min(part.gpus_default, node_gpus)
    return min(1, node_gpus) if profile.one_task_per_gpu else 0


def _gpus_per_node(req: ResourceRequest, node_gpus: int) -> int:
    default = default_gpus(req.profile, req.part, req.exclusive, node_gpus)
    tasks = req.options.tasks_per_node
    if _gpus_follow_tasks(req) and tasks is not None and tasks >= 1:
        if tasks > node_gpus:
            raise UserError(
                "--tasks-per-node",
                f"{_count(tasks, 'task')} per node on {req.partition_name}",
                f"one task per GPU, and its nodes have {node_gpus}",
                f"Ask for {node_gpus} or fewer, or give --gpus-per-node N to share GPUs",
            )
        default = tasks
    gpus = _given(req.options.gpus_per_node, default)
    if gpus < 0:
        raise UserError("--gpus-per-node", f"{gpus}", "at least 0", "Ask for 0 or more GPUs")
    if gpus > node_gpus and not req.in_allocation:
        if req.local and req.sources.get("gpus_per_node") == "project":
            raise UserError(
                f"{PROJECT_FILE} [run] gpus-per-node",
                f"{gpus} GPUs per node on this machine",
                f"it has {node_gpus} (nvidia-smi, amd-smi and rocm-smi list none)"
                if not node_gpus
                else f"it has {node_gpus}",
                "Pass --gpus-per-node 0 for local runs, or drop gpus-per-node from [run]",
            )
        where = f"nodes of {req.partition_name}" if req.part else f"{req.profile.name} nodes"
        raise UserError(
            "--gpus-per-node",
            f"{gpus} GPUs per node",
            f"{where} have {node_gpus}",
            f"Ask for {node_gpus} or fewer" if node_gpus else "Drop --gpus-per-node",
        )
    return gpus


def _gpus_follow_tasks(req: ResourceRequest) -> bool:
    """On a one-task-per-GPU site's partial-node partition (as LUMI's GPU ones) a job
    that gives its tasks per node but not its GPUs gets one GPU per task: left at the
    partition's default, 8 ranks would share 1 GCD with 1 CPU each."""
    partial = req.part is not None and not req.part.whole_node and not req.exclusive
    return req.profile.one_task_per_gpu and partial and req.options.gpus_per_node is None


def _check_local_ranks(nodes: int, tasks: int, sources: Mapping[str, str]) -> None:
    if nodes * tasks <= MAX_LOCAL_RANKS:
        return
    if tasks > MAX_LOCAL_RANKS:  # one node alone is too many, whatever -N says
        field = "--tasks-per-node"
    else:
        field = _blame(sources, (("nodes", "--nodes"), ("tasks_per_node", "--tasks-per-node")))
    if field == "--nodes":
        fix = f"Use at most {_count(max(1, MAX_LOCAL_RANKS // tasks), 'node')} locally, "
        fix += "or fewer tasks per node"
    else:
        most = _count(max(1, MAX_LOCAL_RANKS // nodes), "task")
        fix = f"Use at most {most} per node locally, or fewer nodes"
    raise UserError(
        field,
        f"{_count(nodes, 'node')} x {_count(tasks, 'task')} = {nodes * tasks} local ranks",
        f"at most {MAX_LOCAL_RANKS}",
        fix,
    )


def _cpus_per_task(req: ResourceRequest, gpus: int, tasks: int) -> int:
    default = 1
    # One task per GPU: each gets its GPU's share of the cores (LUMI: 7).
    if req.profile.node.cpus_per_gpu and gpus and tasks == gpus:
        default = req.profile.node.cpus_per_gpu
    return positive("--cpus-per-task", _given(req.options.cpus_per_task, default), "CPUs per task")


def _check_cpus_per_node(
    tasks: int, cpus: int, usable: Optional[int], sources: Mapping[str, str]
) -> None:
    # torchrun asks Slurm for one task holding all ranks' CPUs: the same product.
    if not usable or tasks * cpus <= usable:
        return
    # A default CPUs per task is not the user's doing: then the tasks are.
    field = _blame(
        sources,
        (("cpus_per_task", "--cpus-per-task"), ("tasks_per_node", "--tasks-per-node")),
        fallback="--tasks-per-node",
    )
    if field == "--cpus-per-task":
        fix = f"Use at most {_count(max(1, usable // tasks), 'CPU')} per task or fewer tasks"
    else:
        fix = f"Use at most {_count(max(1, usable // cpus), 'task')} per node"
        fix += " or fewer CPUs per task" if cpus > 1 else ""
    raise UserError(
        field,
        f"{_count(tasks, 'task')} x {_count(cpus, 'CPU')} = {tasks * cpus} per node",
        f"nodes have {usable} usable cores",
        fix,
    )


# Slurm's MaxTasksPerNode default: the most tasks a step may start on one node, whatever
# --overcommit says (https://slurm.schedmd.com/slurm.conf.html#OPT_MaxTasksPerNode).
MAX_TASKS_PER_NODE = 512


def _check_overcommit(req: ResourceRequest, tasks: int) -> None:
    """--overcommit lifts the cores-per-node check, within what Slurm still refuses."""
    launcher = req.options.launcher or req.profile.launcher
    if launcher == "torchrun":
        raise UserError(
            "--overcommit",
            "with --launcher torchrun",
            "torchrun is one Slurm task per node holding every rank's CPUs: nothing to overcommit",
            "Use --launcher srun with --overcommit, or drop --overcommit",
        )
    if tasks > MAX_TASKS_PER_NODE:
        raise UserError(
            "--tasks-per-node",
            f"{_count(tasks, 'task')} per node with --overcommit",
            f"Slurm starts at most {MAX_TASKS_PER_NODE} (MaxTasksPerNode's default)",
            f"Ask for {MAX_TASKS_PER_NODE} or fewer per node, or more nodes",
        )


def _memory(req: ResourceRequest, gpus: int) -> tuple[Optional[int], Optional[int]]:
    mem, mem_per_gpu = req.options.mem, req.options.mem_per_gpu
    if mem is not None and mem_per_gpu is not None:
        raise UserError("--mem", "given together with --mem-per-gpu", "", "Give only one of them")
    profile = req.profile
    if mem is None and mem_per_gpu is None and profile.mem_per_gpu and gpus and not req.local:
        mem_per_gpu = parse_memory(profile.mem_per_gpu, "mem_per_gpu")
    node_mem = _node_memory(req)
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
    return mem, mem_per_gpu


def _time(req: ResourceRequest) -> Optional[int]:
    time_s = req.options.time
    part = req.part
    if time_s and time_s < JOB_TIME_LEAST and not req.local:
        # Slurm rounds seconds up to whole minutes (and -t 0, refused too, is no limit
        # there): a job of 0:05 would get a minute. Locally seconds are kept as given.
        raise UserError(
            "--time",
            f"{format_time(time_s)} is {time_s} seconds",
            "at least 1 minute: Slurm rounds seconds up to whole minutes",
            "Give whole minutes, e.g. -t 1 or -t 0:01:00",
        )
    if part and part.max_time and time_s and time_s > part.max_time:
        raise UserError(
            "--time",
            f"{format_time(time_s)} on {req.partition_name}",
            f"the partition's limit is {format_time(part.max_time)}",
            f"Ask for {format_time(part.max_time)} or less, or pick another partition",
        )
    return time_s


JOB_TIME_LEAST = 60  # seconds: a Slurm job's time limit is whole minutes


# -- what the dry-run says about defaults ---------------------------------------------


# -- naming the field to blame --------------------------------------------------------


def _blame(
    sources: Mapping[str, str], candidates: Sequence[tuple[str, str]], fallback: str = ""
) -> str:
    """The field of the value the user typed just now (command line) first, then of one
    from another layer (project file, environment), else `fallback` (else the first)."""
    for wanted in (lambda s: s == "cli", lambda s: True):
        for key, field in candidates:
            if key in sources and wanted(sources[key]):
                return field
    return fallback or candidates[0][1]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
