"""A site's rules that reject jobs (a profile's [[rules]]), checked before sbatch: a job
the site would refuse is refused here in the site's own words, before it waits in a queue
or leaves anything behind. The rules are data in the profile (config/profiles.py
SiteRule); docs/sites.md lists each site's rules with their sources."""

from __future__ import annotations

from hpclaunch.basics.units import format_time
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.options import sbatch_line
from hpclaunch.config.profiles import Profile, SiteRule
from hpclaunch.errors import UserError


def sbatch_lines_of(spec: JobSpec) -> list[str]:
    """The #SBATCH lines a rule may forbid: the GPU request, the plain Slurm flags and
    the raw --sbatch-arg lines, as this site spells them (script/render.py's order)."""
    spellings = dict(spec.sbatch_spellings)
    lines = []
    if spec.gpus_per_node:
        lines.append(spec.gpu_request_line())
    lines += [sbatch_line(name, value, spellings) for name, value in spec.slurm_flags]
    lines += ["#SBATCH " + arg for arg in spec.sbatch_args]
    return lines


def _tasks_per_node(spec: JobSpec) -> int:
    return max(1, spec.ntasks // spec.nodes)


def check(spec: JobSpec, profile: Profile) -> None:
    """Refuse `spec` in one line when one of the profile's rules would reject it."""
    if not profile.rules and not spec.sbatch_spellings:
        return
    _per_task_divides(spec, profile)
    for rule in profile.rules:
        if rule.partition and rule.partition != spec.partition:
            continue
        broken = _broken(rule, spec)
        if broken:
            field, value, limit = broken
            where = f" ({rule.source})" if rule.source else ""
            raise UserError(field, value, limit, f"{profile.name} says: {rule.message}{where}")


def _broken(rule: SiteRule, spec: JobSpec) -> tuple[str, str, str] | None:
    """(field, value, limit) of the request that breaks `rule`, else None."""
    if rule.kind == "min_cpus_per_gpu" and spec.gpus_per_node:
        cpus = spec.cpus_per_task * spec.tasks_per_node  # ranks per node (torchrun too)
        per_gpu = cpus // spec.gpus_per_node
        if per_gpu < rule.value:
            return (
                "--cpus-per-task",
                f"{spec.cpus_per_task} CPUs per rank is {per_gpu} per GPU",
                f"at least {rule.value} per GPU",
            )
    qos = dict(spec.slurm_flags).get("qos")
    if rule.kind == "require_qos" and not qos:
        return ("--qos", "not given", f"required on partition {spec.partition or '(default)'}")
    over = (spec.time_s or 0) > rule.value
    if rule.kind == "qos_over_time" and over and qos != rule.qos:
        limit = f"--qos={rule.qos} beyond {format_time(rule.value)}"
        return ("--time", format_time(spec.time_s or 0), limit)
    if rule.kind == "forbid_line":
        for line in sbatch_lines_of(spec):
            if line.removeprefix("#SBATCH ").startswith(rule.line):
                return ("#SBATCH", line, f"no {rule.line} on this site")
    return None


def _per_task_divides(spec: JobSpec, profile: Profile) -> None:
    """A site that takes GPUs per task ({per_task}) needs the node's GPUs split evenly."""
    spelled = dict(spec.sbatch_spellings).get("gpus-per-node", "")
    tasks = _tasks_per_node(spec)
    if "{per_task}" in spelled and spec.gpus_per_node % tasks:
        raise UserError(
            "--tasks-per-node",
            f"{tasks} ranks for {spec.gpus_per_node} GPUs per node",
            f"{profile.name} gives GPUs per rank ({spelled}): a divisor of the GPUs",
            f"Use --tasks-per-node {spec.gpus_per_node} (one GPU each) or 1",
        )
