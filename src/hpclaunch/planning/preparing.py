"""A request -> a validated JobSpec and its profile: the layers (config/layering.py), the cluster
(asked of Slurm when no layer names one), the profile filled in from sinfo, the checks
of staging capacity, containers and venvs. Writes nothing: --dry-run stops after this.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpclaunch import backends
from hpclaunch.config import layering, projectfile
from hpclaunch.config.jobspec import NO_PARTS, ContainerJob, JobSpec, Parts, StageItem
from hpclaunch.config.options import SLURM_FLAGS, RunOptions
from hpclaunch.config.profiles import Profile, load_profile
from hpclaunch.errors import UserError
from hpclaunch.payload import containers, project, stage, venvpack, venvs
from hpclaunch.planning import dependencies, siterules
from hpclaunch.planning.validate import Checked, check
from hpclaunch.records import runpaths
from hpclaunch.slurm import discover


@dataclass(frozen=True)
class Prepared:
    spec: JobSpec
    profile: Profile
    project_file: Optional[Path]
    in_allocation: bool
    warnings: tuple[str, ...] = ()  # printed before anything is submitted
    after: tuple[dependencies.After, ...] = ()  # --after, resolved (recorded with the run)


def prepare_spec(
    cli: Mapping[str, Any],
    program: tuple[str, ...],
    cwd: Path,
    environ: Mapping[str, str],
) -> Prepared:
    """All layers -> a validated JobSpec. `cli` holds only the options the caller gave."""
    layers = layering.layers(cli, cwd, environ)
    cluster, csource = layers.cluster or choose_cluster(layers.project_run, environ)
    sources = {**layers.sources, "cluster": csource}
    options = layers.options
    profile = load_profile(cluster, layers.project_clusters, environ)
    chosen = backends.chosen(profile, discover.in_allocation(environ))  # asked, never named
    if profile.discover and chosen.asks_sinfo:
        profile = _with_discovered(profile)

    allocation = chosen.step_of_allocation
    checked = check(profile, options, sources, program, environ, allocation, project.name(cwd))
    after = tuple(dependencies.resolve(options.after, environ))
    staged = _staging(checked, options, cwd, allocation)
    job, venv, venv_image, warnings = _container(checked, staged.stage, options, environ, cwd)
    if venv_image:
        venvpack.check_backend(job, runs_here=chosen.runs_here or allocation)
    limit = options.snapshot_limit
    # The JobSpec, built once: the checked request and each feature's typed part.
    parts = Parts(
        snapshot=chosen.snapshots_by_default and not options.no_snapshot,
        snapshot_limit_bytes=NO_PARTS.snapshot_limit_bytes if limit is None else limit,
        dependency=dependencies.sbatch_value(after),
        stage=staged.stage,
        stage_out=staged.stage_out,
        local_dir=staged.local_dir,
        container=job,
        venv=venv,
        venv_image=venv_image,
    )
    spec = checked.spec(parts)
    siterules.check(spec, profile)  # the site's own refusals, in its words, before sbatch
    if chosen.runs_here:
        warnings = [*_local_notes(sources), *warnings]
    # Which project file gave settings, and those ignored (unless the CLI said so already).
    ignored = projectfile.untold(layers.project_warnings)
    warnings = [
        *(f"hpclaunch: warning: {line}" for line in ignored),
        *projectfile.used_line(layers.project_file),
        *warnings,
    ]
    return Prepared(
        spec=spec,
        profile=profile,
        project_file=layers.project_file,
        in_allocation=allocation,
        warnings=tuple(warnings),
        after=after,
    )


# Options that only Slurm acts on: a local run names them once instead of dropping them.
_SLURM_ONLY = ("mem", "mem_per_gpu", "partition", "account", "exclusive", "overcommit",
               "sbatch_arg",
               *(opt.dest for opt in SLURM_FLAGS))  # fmt: skip


def _local_notes(sources: Mapping[str, str]) -> list[str]:
    given = [name for name in _SLURM_ONLY if sources.get(name) in ("cli", "project")]
    if not given:
        return []
    names = ", ".join("--" + name.replace("_", "-") for name in given)
    verb = "does" if len(given) == 1 else "do"
    return [f"hpclaunch: note: {names} {verb} not apply to a local run (no Slurm): ignored"]


def choose_cluster(project_run: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[str, str]:
    """(cluster, why): named by a layer, else detected from the Slurm controller."""
    named = layering.named_cluster(project_run, environ)
    if named is not None:
        return named
    name = discover.cluster_name() if discover.slurm_config() is not None else None
    if name is None:
        signs = discover.slurm_signs(environ)
        if signs:  # a broken Slurm must not quietly become a run on this (login) node
            raise discover.no_controller("Slurm is set up here", signs)
        return "local", "detected: no Slurm"
    if name.lower().startswith("lumi"):
        return "lumi", f"detected: ClusterName={name}"
    return "slurm", f"detected: ClusterName={name}"


def profile_for(cluster: Optional[str], cwd: Path, environ: Mapping[str, str]) -> Profile:
    """The profile a command other than `run` works with (--cluster, else the default)."""
    layers = layering.layers({}, cwd, environ)
    name = cluster or choose_cluster(layers.project_run, environ)[0]
    return load_profile(name, layers.project_clusters, environ)


@dataclass(frozen=True)
class _Staged:
    """--stage / --stage-out's part of the JobSpec."""

    stage: tuple[StageItem, ...] = ()
    stage_out: tuple[tuple[str, str], ...] = ()
    local_dir: str = ""


def _staging(
    checked: Checked,
    options: RunOptions,
    cwd: Path,
    in_allocation: bool,
) -> _Staged:
    """--stage / --stage-out: planned and checked against the node-local space (packing
    happens when the run starts: launching.start)."""
    if not options.stage and not options.stage_out:
        return _Staged()
    profile, res = checked.profile, checked.res
    if in_allocation:
        raise UserError(
            "--stage",
            "staging inside an salloc allocation is not supported yet",
            "",
            "Submit the job from outside the allocation (hpclaunch run submits with sbatch)",
        )
    items = stage.plan_stage(options.stage, cwd, runpaths.absolute(checked.run_root, cwd))
    part = profile.partition(checked.partition)
    space = (part.local_disk_mb if part else None) or profile.node.local_disk_mb
    node_mem = (part.memory_mb if part and part.memory_mb else None) or profile.node.memory_mb
    ram: Optional[int] = None
    if profile.local_is_ram:
        if res.mem_mb:
            ram = res.mem_mb
        elif res.mem_per_gpu_mb and res.gpus_per_node:
            ram = res.mem_per_gpu_mb * res.gpus_per_node
        else:
            ram = node_mem
    where = f"nodes of {checked.partition}" if part else f"{profile.name} nodes"
    stage.check_capacity(items, space, ram, where)
    return _Staged(items, stage.parse_stage_out(options.stage_out, cwd), profile.local_dir)


def _container(
    checked: Checked,
    staged: tuple[StageItem, ...],
    options: RunOptions,
    environ: Mapping[str, str],
    cwd: Path,
) -> tuple[Optional[ContainerJob], str, str, list[str]]:
    """--container, --bind, --venv: the image, its binds, the venv (its path; a packed
    venv's SquashFS file too), all checked."""
    profile, res = checked.profile, checked.res
    venv = str(runpaths.absolute(options.venv, cwd)) if options.venv else ""
    # A packed venv (env pack's FILE.sqsh) is seen at its original path, where it mounts.
    packed = venvpack.mount_path(venv) if venv and venvpack.is_packed(venv) else ""
    image = ""
    ckpt = checked.checkpoint_root
    own = [
        ("run", str(runpaths.absolute(checked.run_root, cwd))),
        ("checkpoints", str(runpaths.absolute(ckpt, cwd)) if ckpt else ""),
        ("project", str(project.root(cwd))),
        ("cwd", str(cwd)),
        ("venv", packed or venv),
    ]
    job = containers.resolve(
        profile, options, environ, cwd, nodes=res.nodes, gpus=res.gpus_per_node, own=own
    )
    warnings: list[str] = []
    if job is not None:
        warnings += containers.image_notes(options.container or "", job.image)
    if packed:
        warnings += venvpack.check_packed(venv, job)
        venv, image = packed, venv
    elif venv:
        venv, warnings = venvs.check_venv(venv, job)
    if job is not None:
        job = containers.check_mount_points(job, profile.container)
        job = containers.with_staged_images(job, staged)
        job = venvpack.with_packed_venv(job, image, venv) if image else job
        line = venvs.shadow_warning(job, venv, profile.python, environ)
        if line:
            warnings.append(line)
    return job, venv, image, warnings


def _with_discovered(profile: Profile) -> Profile:
    """Fill partitions the profile does not describe from sinfo (profile facts win)."""
    if discover.ask_together() is None:  # scontrol show config and sinfo, at once
        raise discover.no_controller(f"cluster {profile.name} needs Slurm", [])
    found = dict(discover.partitions())  # one sinfo call, answered already
    merged = {**found, **profile.partitions}
    return profile.model_copy(
        update={"partitions": merged, "cluster_name": discover.cluster_name()}
    )
