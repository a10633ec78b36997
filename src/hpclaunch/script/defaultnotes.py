"""The job script's comment lines on what the job gets because the request left it out
(GPUs per node, the time limit) and how to ask for something else."""

from __future__ import annotations

import textwrap
from typing import Optional

from hpclaunch.basics.units import format_memory, format_time
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profilekinds import runs_here
from hpclaunch.config.profiles import Partition, Profile, gpus_on_node


def default_notes(spec: JobSpec, profile: Profile) -> list[str]:
    """Comment lines on what the job gets because the request left it out (GPUs per
    node, the time limit) and how to ask for something else."""
    if runs_here(profile.kind) or not spec.partition:  # no partition: a step of an allocation
        return []
    given = {key for key, _ in spec.sources}
    part = profile.partition(spec.partition)
    notes = []
    if "gpus_per_node" not in given and spec.gpus_per_node and part is not None:
        notes.append(_gpus_note(spec, profile, part))
    if spec.time_s is None:
        notes.append(_time_note(spec.partition, part))
    return [
        "# " + line
        for note in notes
        for line in textwrap.wrap(note, 86, break_long_words=False, break_on_hyphens=False)
    ]


def _gpus_note(spec: JobSpec, profile: Profile, part: Partition) -> str:
    name, gpus, most = spec.partition, spec.gpus_per_node, gpus_on_node(profile, part)
    count = f"{gpus} GPU{'s' if gpus > 1 else ''} per node by default"
    if any(key == "tasks_per_node" for key, _ in spec.sources) and not part.whole_node:
        count = f"{gpus} GPU{'s' if gpus > 1 else ''} per node, one per task"
    if spec.tasks_per_node == gpus:
        mem = f" and {format_memory(spec.mem_per_gpu_mb)}" if spec.mem_per_gpu_mb else ""
        count += f" (one rank with {spec.cpus_per_task} CPUs{mem} per GPU)"
    if part.whole_node:
        return (
            f"{name} allocates whole nodes: all {count}; use fewer with --gpus-per-node N "
            "(the whole node is still allocated)"
        )
    if gpus == most and spec.exclusive:
        return (
            f"--exclusive takes whole nodes of {name}: all {count}; "
            "use fewer with --gpus-per-node N"
        )
    more = ""
    if profile.one_task_per_gpu:  # --exclusive: every GPU, ranks bound to their cores
        bound = ", ranks bound to their GPUs' cores" if profile.cpu_bind != "none" else ""
        more = f" (all {most} GPUs{bound})"
    return (
        f"{name} allocates parts of nodes: {count}; ask for more with --gpus-per-node N "
        f"(up to {most}) or take whole nodes with --exclusive{more}"
    )


def _time_note(name: str, part: Optional[Partition]) -> str:
    """Slurm gives a job without --time its partition's DefaultTime (else MaxTime)."""
    most = format_time(part.max_time) if part and part.max_time else ""
    ask = f"ask for up to {most} with -t TIME" if most else "ask for a limit with -t TIME"
    if part and part.default_time:
        default = format_time(part.default_time)
        return f"no -t/--time: Slurm gives the job {name}'s default time limit, {default}; {ask}"
    without = f"its MaxTime, {most}" if most else "its MaxTime"
    return (
        f"no -t/--time: Slurm applies {name}'s DefaultTime (scontrol show partition {name} "
        f"shows it; without one, {without}); {ask}"
    )
