"""`sweep --pack`: the slot plan. An allocation of N nodes is cut into slots, each G GPUs
of one node (their cores: the profile's topology, else an even share of the node's) or
C cores when no GPUs are asked; the node agents (node/pack_agent.py) run one point per
slot and refill it from the queue as points end.

Pure: every refusal here comes before anything is written or queued.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from hpclaunch.errors import UserError


@dataclass(frozen=True)
class PackOptions:
    """What `--pack` asks, as given (None: the default)."""

    gpus_per_point: Optional[int] = None
    cpus_per_point: Optional[int] = None
    tasks_per_point: int = 1
    retries: int = 0
    point_time_s: Optional[int] = None
    pack_jobs: int = 1
    mem_per_point_mb: Optional[int] = None


@dataclass(frozen=True)
class Slot:
    node: int  # the node's place in the allocation (SLURM_NODEID)
    number: int  # the slot's number on that node
    gpus: tuple[int, ...]  # the node's GPU indices the point sees
    cpus: tuple[int, ...]  # the cores the point is bound to

    def to_record(self) -> dict[str, Any]:
        return {"node": self.node, "slot": self.number, "gpus": list(self.gpus),
                "cpus": list(self.cpus)}  # fmt: skip


@dataclass(frozen=True)
class NodeFacts:
    """One node of the allocation: its GPUs and cores, and the cores bound to each GPU
    (empty when the profile has no topology: an even share of the cores)."""

    gpus: int
    cpus: int
    gpu_cores: tuple[tuple[int, ...], ...] = ()
    memory_mb: Optional[int] = None


def check(opts: PackOptions, facts: NodeFacts, points: int) -> None:
    """Every bad --pack request, one line each, before anything is queued."""
    gpus, cpus = opts.gpus_per_point, opts.cpus_per_point
    if gpus is not None and gpus < 1:
        raise UserError("--gpus-per-point", f"{gpus} is below 1", "at least 1", "Give 1 or more")
    if gpus is not None and gpus > facts.gpus:
        raise UserError(
            "--gpus-per-point",
            f"{gpus} is more than a node's {facts.gpus} GPUs",
            f"at most {facts.gpus}",
            "Ask fewer GPUs per point, or a partition with more GPUs per node",
        )
    if gpus is not None and facts.gpus % gpus:
        raise UserError(
            "--gpus-per-point",
            f"{gpus} does not divide a node's {facts.gpus} GPUs",
            f"a divisor of {facts.gpus}",
            "Pick a divisor, so that no GPU of a node stays idle",
        )
    if cpus is not None and not 1 <= cpus <= facts.cpus:
        above = f"above a node's {facts.cpus} cores"
        raise UserError(
            "--cpus-per-point",
            f"{cpus} is {'below 1' if cpus < 1 else above}",
            f"1 to {facts.cpus}",
            "Ask at most a node's cores per point",
        )
    for field, value, low in (
        ("--tasks-per-point", opts.tasks_per_point, 1),
        ("--retries", opts.retries, 0),
    ):
        if value < low:
            raise UserError(field, f"{value} is below {low}", f"at least {low}", f"Give {low}+")
    if not 1 <= opts.pack_jobs <= max(1, points):
        raise UserError(
            "--pack-jobs",
            f"{opts.pack_jobs} is {'below 1' if opts.pack_jobs < 1 else 'above the points'}",
            f"1 to {points}, the points",
            "Give at most one allocation per point",
        )
    slot_gpus = _slot_gpus(opts, facts)
    if slot_gpus and opts.tasks_per_point > slot_gpus:
        raise UserError(
            "--tasks-per-point",
            f"{opts.tasks_per_point} is more than a slot's {slot_gpus} GPUs",
            f"at most {slot_gpus}",
            "Raise --gpus-per-point to the tasks a point runs",
        )


def _slot_gpus(opts: PackOptions, facts: NodeFacts) -> int:
    """GPUs per slot: as asked, else 1 on a node with GPUs unless cores were asked."""
    if opts.gpus_per_point is not None:
        return opts.gpus_per_point
    return 1 if facts.gpus and opts.cpus_per_point is None else 0


def slots(opts: PackOptions, facts: NodeFacts, nodes: int, cpus_per_task: int = 1) -> list[Slot]:
    """The slots of one allocation of `nodes` such nodes, node by node."""
    per_slot = _slot_gpus(opts, facts)
    if per_slot:
        count = facts.gpus // per_slot
        gpu_sets = [tuple(range(s * per_slot, (s + 1) * per_slot)) for s in range(count)]
        share = facts.cpus // count
        cores = [_gpu_cores(g, facts, s, share) for s, g in enumerate(gpu_sets)]
    else:
        width = opts.cpus_per_point or min(facts.cpus, opts.tasks_per_point * cpus_per_task)
        count = max(1, facts.cpus // width)
        gpu_sets = [()] * count
        cores = [tuple(range(s * width, (s + 1) * width)) for s in range(count)]
    return [
        Slot(node, number, gpu_sets[number], cores[number])
        for node in range(nodes)
        for number in range(count)
    ]


def _gpu_cores(gpus: Sequence[int], facts: NodeFacts, number: int, share: int) -> tuple[int, ...]:
    """The cores bound to these GPUs (LUMI: each GCD's CCD, the masks a whole-node job
    gets), else the slot's even share of the node's cores."""
    if facts.gpu_cores and len(facts.gpu_cores) >= max(gpus) + 1:
        return tuple(sorted(c for g in gpus for c in facts.gpu_cores[g]))
    return tuple(range(number * share, (number + 1) * share))


def mem_per_point(opts: PackOptions, facts: NodeFacts, per_node: int) -> Optional[int]:
    """A point's memory bound in MB: as asked, else the node's memory shared among its
    slots (None when the node's memory is unknown)."""
    if opts.mem_per_point_mb is not None:
        return opts.mem_per_point_mb
    return facts.memory_mb // per_node if facts.memory_mb else None


def table(planned: Sequence[Slot]) -> list[str]:
    """The slot table --dry-run shows."""
    rows = ["# slots (node, slot, GPUs, cores):"]
    for slot in planned:
        gpus = ",".join(map(str, slot.gpus)) or "-"
        rows.append(f"#   node {slot.node}  slot {slot.number}  gpus {gpus}  cores "
                    f"{_ranges(slot.cpus)}")  # fmt: skip
    return rows


def _ranges(cores: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the Linux cpulist format)."""
    out: list[str] = []
    for core in sorted(cores):
        if out and out[-1].split("-")[-1] == str(core - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{core}"
        else:
            out.append(str(core))
    return ",".join(out) or "-"
