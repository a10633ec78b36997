"""--profile-ranks/--profiler and --nccl-debug's file collection on the submitting side:
the options checked (one line each, before anything is submitted), the variables every
task gets, and the py-spy binary shipped into the run folder.

The in-job half is the bootstrap's (node/bootstrap.py): a chosen rank runs its program
under the profiler, inside the container where the rank runs; every rank moves its
NCCL_DEBUG_FILE into the log folder when its program ends (docs/profiling.md).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from hpclaunch import node
from hpclaunch.basics.elfarch import machine_of
from hpclaunch.basics.shell import Word
from hpclaunch.config.jobspec import JobSpec, Profiling
from hpclaunch.config.options import BY_NAME, RunOptions
from hpclaunch.config.profiles import Profile
from hpclaunch.errors import UserError, show
from hpclaunch.records.runpaths import RunPaths

TOOLS = BY_NAME["profiler"].choices
# Profilers the nodes must have on PATH (py-spy is shipped; torch is the program's own).
ON_PATH = ("nsys", "rocprof")


def from_values(
    options: RunOptions,
    world_size: int,
    local: bool,
    environ: Mapping[str, str],
    arch: str = "",
) -> Optional[Profiling]:
    """The checked request, or None without one. Both options or neither; ranks within
    the job; the profiler present where that can be seen from here; a shipped py-spy
    built for `arch`, the nodes' CPUs (the profile's; "" for a local run: this machine)."""
    text, tool = options.profile_ranks, options.profiler
    if text is None and tool is None:
        return None
    if tool is None:
        raise UserError(
            "--profile-ranks", f"{show(text)} without --profiler", "", "Add --profiler py-spy"
        )
    if text is None:
        raise UserError(
            "--profiler", f"{tool} without --profile-ranks", "", "Add --profile-ranks 0"
        )
    if tool not in TOOLS:
        raise UserError("--profiler", f"{show(tool)} is unknown", f"one of {', '.join(TOOLS)}", "")
    ranks = parse_ranks(str(text), world_size)
    pyspy = ""
    if tool == "py-spy":
        pyspy = _pyspy(environ)
        _same_arch(pyspy, arch)
    elif tool in ON_PATH and local and not options.container:
        _on_path(str(tool), environ)
    return Profiling(ranks=ranks, tool=str(tool), pyspy=pyspy)


def _on_path(tool: str, environ: Mapping[str, str]) -> None:
    """A local run starts the profiler from this PATH (an image's PATH cannot be seen
    from here; a node's neither: there the rank reports it)."""
    if shutil.which(tool, path=environ.get("PATH")) is None:
        raise UserError(
            "--profiler",
            f"{tool} is not on PATH",
            "a local run starts it from there",
            f"Install {tool} (or load its module), or pick another --profiler",
        )


def parse_ranks(text: str, world_size: int) -> tuple[int, ...]:
    """'0,14' -> (0, 14): whole numbers below the job's world size, sorted, once each."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise UserError(
            "--profile-ranks", "is empty", "", "Give rank numbers, e.g. --profile-ranks 0,14"
        )
    ranks: set[int] = set()
    for item in items:
        if not item.isdigit() or not item.isascii():
            raise UserError(
                "--profile-ranks",
                f"{show(item)} is not a rank number",
                "whole numbers from 0, comma-separated",
                "Write e.g. --profile-ranks 0,14",
            )
        rank = int(item)
        if rank >= world_size:
            raise UserError(
                "--profile-ranks",
                f"rank {rank} is not in the job",
                f"ranks 0-{world_size - 1} ({world_size} ranks)",
                f"Choose ranks below {world_size}, or ask for more nodes or tasks",
            )
        ranks.add(rank)
    return tuple(sorted(ranks))


def _pyspy(environ: Mapping[str, str]) -> str:
    """This side's py-spy, found as `hpclaunch stack` finds it (stacks.pyspy_paths)."""
    from hpclaunch.observe.stacks import PYSPY_FIX, pyspy_paths

    found = pyspy_paths(environ)
    if not found:
        raise UserError(
            "--profiler",
            "py-spy is not installed here",
            "hpclaunch ships this side's py-spy (a static binary) to the ranks",
            PYSPY_FIX,
        )
    return found[0]


def _same_arch(pyspy: str, arch: str) -> None:
    """The shipped py-spy must run on the nodes (issue 31: Alps, JUPITER and Isambard-AI
    are aarch64): refused here rather than failing in the rank after the queue."""
    built_for = machine_of(Path(pyspy))
    if arch and built_for is not None and built_for != arch:
        raise UserError(
            "--profiler",
            f"py-spy {pyspy} is built for {built_for}",
            f"the cluster profile's nodes are {arch} (its arch)",
            f"Install a py-spy built for {arch} first on PATH (pip download py-spy "
            f"--only-binary :all: --platform manylinux2014_{arch}), or pick another --profiler",
        )


def pyspy_path(paths: RunPaths) -> Path:
    """Where the ranks find the shipped py-spy: beside the bootstrap."""
    return (paths.shipped_dir or paths.run_dir) / node.PYSPY


def task_env(spec: JobSpec, profile: Profile, paths: RunPaths) -> list[tuple[str, Word]]:
    """The variables the bootstrap reads for these features (render.task_env)."""
    env: list[tuple[str, Word]] = []
    prof = spec.profiling
    if prof is not None:
        env += [
            (node.HPCLAUNCH_PROFILER, prof.tool),
            (node.HPCLAUNCH_PROFILE_RANKS, ",".join(str(r) for r in prof.ranks)),
            (node.HPCLAUNCH_PROFILE_DIR, str(paths.run_dir / node.PROFILES)),
        ]
        if prof.tool == "py-spy":
            env.append((node.HPCLAUNCH_PYSPY, str(pyspy_path(paths))))
    if spec.nccl_debug and "NCCL_DEBUG_FILE" in profile.debug_env:
        env.append((node.HPCLAUNCH_NCCL_COLLECT, "1"))
    return env


def ship(spec: JobSpec, paths: RunPaths) -> None:
    """Copy py-spy into the run folder: the run folder is bound into every container,
    and the binary is static, so any image (even one without Python's tools) runs it."""
    prof = spec.profiling
    if prof is not None and prof.pyspy:
        target = pyspy_path(paths)
        if not target.exists():
            shutil.copy2(prof.pyspy, target)
