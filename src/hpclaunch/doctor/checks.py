"""hpclaunch doctor, before anything is submitted: the checks a site can answer from the
login node (the controller, the partition's nodes and their GPUs, the profile's binds and
image as far as they can be seen here), the table every check ends in, and the verdict.
The job that checks the rest: doctor/probejob.py.

A check that cannot be met (too few nodes up, a partition that does not exist) stops the
doctor before it submits: it never leaves a job waiting in the queue."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Optional

from hpclaunch import backends
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profiles import Profile, gpus_on_node
from hpclaunch.config.topology import local_gpus
from hpclaunch.slurm import commands, discover

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
# sinfo states (%T) a node can run a new job in; anything else (drained, down, ...) not.
USABLE = {"idle", "mixed", "allocated", "completing", "planned"}


@dataclass(frozen=True)
class Check:
    name: str  # what was checked, short: "nodes", "GPUs per node", ...
    status: str  # PASS, WARN or FAIL
    detail: str  # what was found
    fix: str = ""  # what to change: a profile key, a bind, a module (FAIL and WARN)

    def to_dict(self) -> dict[str, str]:
        found = asdict(self)
        if self.status == PASS:  # nothing to change: a fix under a PASS misleads
            found["fix"] = ""
        return found


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # sinfo's long state, lower case, without its flags (*, ~, #, ...)
    gpus: int  # from sinfo's GRES


def node_states(partition: str) -> Optional[list[NodeInfo]]:
    """The partition's nodes (one sinfo call), or None when sinfo does not answer."""
    argv = ["sinfo", "-h", "-N", "-o", "%N|%T|%G"] + (["-p", partition] if partition else [])
    out = commands.query(argv)
    if out is None:
        return None
    found: dict[str, NodeInfo] = {}
    for line in out.splitlines():
        name, _, rest = line.partition("|")
        state, _, gres = rest.partition("|")
        state = state.strip().lower().rstrip("*~#!%$@^-+")
        if name:
            found[name] = NodeInfo(name, state, discover.gres_gpus(gres))
    return sorted(found.values(), key=lambda n: n.name)


def machine_cores() -> int:
    """The CPUs this process may run on (a container's or cgroup's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity
        return os.cpu_count() or 1


def local_cores(spec: JobSpec, cores: int) -> Check:
    """A local run's ranks against this machine's cores: every simulated node is here."""
    ranks = spec.nodes * spec.tasks_per_node
    wanted = ranks * spec.cpus_per_task
    text = f"{ranks} rank(s) x {spec.cpus_per_task} CPU(s) = {wanted} on {cores} core(s) here"
    if wanted <= cores:
        return Check("CPU cores", PASS, text)
    fix = (
        "The ranks share cores and run slower than on a cluster: fewer -N/--tasks-per-node "
        "or --cpus-per-task here, the real layout on the cluster"
    )
    return Check("CPU cores", WARN, text + ": oversubscribed", fix)


def preflight(spec: JobSpec, profile: Profile) -> tuple[list[Check], int]:
    """The checks before submitting, and the GPUs per node the job should ask for (the
    nodes' own count when the profile claims more: the rest is still worth checking)."""
    if backends.chosen(profile, in_allocation=False).runs_here:
        here = [Check("controller", PASS, "local run: no Slurm")]
        here.append(local_cores(spec, machine_cores()))
        # The local profile asks for no GPUs: on a workstation with some, the probe job
        # asks for them all, so that the GPUs its rank sees and NCCL are checked too.
        gpus = spec.gpus_per_node or local_gpus()
        if gpus:
            here.append(Check("GPUs here", PASS, f"{gpus} (the GPU tool on PATH lists them)"))
        return here, gpus
    config = discover.slurm_config()
    if not config:
        fix = "Check SLURM_CONF and that slurmctld runs, or use --cluster local"
        return [Check("controller", FAIL, "no Slurm controller answers", fix)], 0
    checks = [Check("controller", PASS, f"{config.get('ClusterName', '?')} answers")]
    nodes = node_states(spec.partition)
    where = f"partition {spec.partition}" if spec.partition else "the default partition"
    if not nodes:
        fix = "Pick one of `sinfo -s`'s partitions with --partition"
        return [*checks, Check("partition", FAIL, f"{where} has no nodes", fix)], 0
    checks.append(_nodes_check(nodes, spec.nodes, where))
    gpu_check, gpus = _gpus_check(nodes, spec, profile)
    checks += [gpu_check] if gpu_check else []
    checks += _seen_here(spec, profile)
    return checks, gpus


def _nodes_check(nodes: list[NodeInfo], wanted: int, where: str) -> Check:
    usable = [n for n in nodes if n.state in USABLE]
    bad = [f"{n.name} ({n.state})" for n in nodes if n.state not in USABLE]
    detail = f"{len(usable)} of {len(nodes)} nodes of {where} can run jobs"
    if bad:
        detail += "; not: " + ", ".join(bad)
    if len(usable) < wanted:
        fix = f"Ask for at most {len(usable)} nodes (-N), or ask the admins to resume " + ", ".join(
            n.name for n in nodes if n.state not in USABLE
        )
        return Check("nodes", FAIL, detail + f"; the check needs {wanted}", fix)
    return Check("nodes", WARN if bad else PASS, detail, "")


def _gpus_check(
    nodes: list[NodeInfo], spec: JobSpec, profile: Profile
) -> tuple[Optional[Check], int]:
    """The profile's GPUs per node against what the nodes declare to Slurm."""
    usable = [n for n in nodes if n.state in USABLE] or nodes
    have = min(n.gpus for n in usable)
    claimed = gpus_on_node(profile, profile.partitions.get(spec.partition))
    if not claimed and not have:
        return None, 0
    if claimed > have:
        detail = f"the {profile.name} profile says {claimed} per node; the nodes have {have}"
        fix = f"Set gpus = {have} for this partition in the {profile.name} profile"
        return Check("GPUs per node", FAIL, detail + " (sinfo GRES)", fix), have
    return Check("GPUs per node", PASS, f"{have} per node (sinfo GRES)"), have


def _seen_here(spec: JobSpec, profile: Profile) -> list[Check]:
    """The image and the profile's binds, where this host sees them (a login node often
    shares the file systems with the nodes; the job checks them on the nodes too)."""
    checks: list[Check] = []
    job = spec.container
    if job is not None:
        ok = os.path.exists(job.image) or job.runtime == "podman-hpc"  # a name in its store
        fix = "" if ok else "Fix --container, or the profile's container image_dirs"
        checks.append(Check("image", PASS if ok else FAIL, job.image, fix))
    missing = [b.path for b in profile.container.binds if not os.path.exists(b.path)]
    if job is not None and missing:
        detail = "not on this host: " + ", ".join(missing) + " (checked on the nodes too)"
        checks.append(Check("binds here", WARN, detail, ""))
    return checks


def failed(checks: Sequence[Check]) -> bool:
    return any(c.status == FAIL for c in checks)


def table(checks: Sequence[Check]) -> list[str]:
    """One line a check: status, name, what was found; the fix indented under it."""
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for check in checks:
        lines.append(f"{check.status:4}  {check.name:{width}}  {check.detail}")
        if check.fix and check.status != PASS:
            lines.append(f"{'':4}  {'':{width}}  fix: {check.fix}")
    return lines


def to_json(checks: Sequence[Check], extra: dict[str, Any]) -> dict[str, Any]:
    return {**extra, "ok": not failed(checks), "checks": [c.to_dict() for c in checks]}
