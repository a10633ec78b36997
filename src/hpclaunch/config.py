"""Configuration layers -> one JobSpec.

built-in profile < user profile < project hpclaunch.toml ([run], [clusters.NAME])
< environment (HPCLAUNCH_CLUSTER, HPCLAUNCH_CONFIG, SBATCH_ACCOUNT/PARTITION/RESERVATION)
< command line. Every value is checked here, before anything is written or submitted.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from . import containers, discover, runs, stage, venvs
from .errors import UserError, show
from .options import BY_NAME
from .profiles import Profile, load_profile, read_toml
from .spec import JobSpec
from .units import parse_memory, parse_time
from .validate import validate

PROJECT_FILE = "hpclaunch.toml"
# sbatch reads these itself; hpclaunch resolves them into the spec so the script shows them.
SBATCH_ENV = {
    "account": "SBATCH_ACCOUNT",
    "partition": "SBATCH_PARTITION",
    "reservation": "SBATCH_RESERVATION",
}


@dataclass(frozen=True)
class Resolved:
    spec: JobSpec
    profile: Profile
    project_file: Optional[Path]
    in_allocation: bool
    warnings: tuple[str, ...] = ()  # printed before anything is submitted


def find_project_file(cwd: Path, environ: Mapping[str, str]) -> Optional[Path]:
    explicit = environ.get("HPCLAUNCH_CONFIG")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise UserError(
                "HPCLAUNCH_CONFIG", f"{show(explicit)} is not a file", "", "Fix or unset it"
            )
        return path
    for folder in (cwd, *cwd.parents):
        candidate = folder / PROJECT_FILE
        if candidate.is_file():
            return candidate
        if (folder / ".git").exists():
            break  # the project ends at its git root
    return None


def _project(path: Optional[Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    if path is None:
        return {}, {}
    data = read_toml(path, PROJECT_FILE)
    unknown = sorted(set(data) - {"run", "clusters"})
    if unknown:
        raise UserError(
            f"{path}",
            f"unknown table {show(unknown[0])}",
            "known: [run], [clusters.NAME]",
            "Remove or rename it",
        )
    run = data.get("run", {})
    for key in run:
        if key not in BY_NAME:
            raise UserError(
                f"{path} [run] {key}",
                "unknown key",
                "keys are the long option names",
                "See hpclaunch run --help",
            )
    return run, data.get("clusters", {})


def default_cluster(project_run: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[str, str]:
    if environ.get("HPCLAUNCH_CLUSTER"):
        return environ["HPCLAUNCH_CLUSTER"], "env:HPCLAUNCH_CLUSTER"
    if project_run.get("cluster"):
        return str(project_run["cluster"]), "project"
    name = discover.cluster_name() if discover.slurm_config() is not None else None
    if name is None:
        return "local", "detected: no Slurm controller"
    if name.lower().startswith("lumi"):
        return "lumi", f"detected: ClusterName={name}"
    return "slurm", f"detected: ClusterName={name}"


def _convert(name: str, value: Any, where: str) -> Any:
    """A CLI string or a TOML value -> the typed value, or a one-line error."""
    opt = BY_NAME[name]
    field = f"--{name}" if where == "cli" else f"{PROJECT_FILE} [run] {name}"
    if opt.kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise UserError(field, f"{show(value)} is not a whole number", "", "Give e.g. 2")
        try:
            return int(value)
        except ValueError:
            raise UserError(
                field, f"{show(value)} is not a whole number", "", "Give e.g. 2"
            ) from None
    if opt.kind == "time":
        return parse_time(str(value), field)
    if opt.kind == "mem":
        return parse_memory(str(value), field)
    if opt.kind == "flag":
        if not isinstance(value, bool):
            raise UserError(field, f"{show(value)} is not true or false", "", "Use true/false")
        return value
    if opt.kind == "list":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            raise UserError(field, f"{show(value)} is not a list of strings", "", 'Use ["..."]')
        return tuple(items)
    if opt.kind == "choice":
        if value not in opt.choices:
            raise UserError(
                field,
                f"{show(value)} is not allowed",
                f"one of {', '.join(opt.choices)}",
                f"Use e.g. {opt.example}",
            )
        return value
    if not isinstance(value, str):
        raise UserError(field, f"{show(value)} is not text", "", f"Use e.g. {opt.example}")
    return value


def resolve(
    cli: Mapping[str, Any],
    program: tuple[str, ...],
    cwd: Path,
    environ: Mapping[str, str],
    write: bool = True,
) -> Resolved:
    """All layers -> a validated JobSpec. `cli` holds only options given on the command line."""
    project_path = find_project_file(cwd, environ)
    project_run, project_clusters = _project(project_path)

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, raw in project_run.items():
        values[BY_NAME[key].dest] = _convert(key, raw, "project")
        sources[BY_NAME[key].dest] = "project"
    for key, env_name in SBATCH_ENV.items():
        if environ.get(env_name):
            values[key] = environ[env_name]
            sources[key] = f"env:{env_name}"
    for key, raw in cli.items():
        name = key.replace("_", "-")
        values[BY_NAME[name].dest] = _convert(name, raw, "cli")
        sources[BY_NAME[name].dest] = "cli"

    if "cluster" in values and sources.get("cluster") == "cli":
        cluster, csource = values["cluster"], "cli"
    else:
        cluster, csource = default_cluster(project_run, environ)
    sources["cluster"] = csource
    profile = load_profile(cluster, project_clusters)
    if profile.discover and profile.kind == "slurm":
        profile = _with_discovered(profile)

    allocation = profile.kind == "slurm" and discover.in_allocation()
    spec = validate(profile, values, sources, program, environ, allocation, project_name(cwd))
    spec = replace(
        spec,
        snapshot=profile.kind == "slurm" and not values.get("no_snapshot"),
        snapshot_limit_mb=values.get("snapshot_limit") or 200,
    )
    spec = _with_staging(spec, profile, values, cwd, write)
    spec, warnings = _with_container(spec, profile, values, environ, cwd)
    return Resolved(
        spec=spec,
        profile=profile,
        project_file=project_path,
        in_allocation=allocation,
        warnings=tuple(warnings),
    )


def profile_for(cluster: Optional[str], cwd: Path, environ: Mapping[str, str]) -> Profile:
    """The profile a command other than `run` works with (--cluster, else the default)."""
    project_run, project_clusters = _project(find_project_file(cwd, environ))
    name = cluster or default_cluster(project_run, environ)[0]
    return load_profile(name, project_clusters)


def _with_staging(
    spec: JobSpec, profile: Profile, values: Mapping[str, Any], cwd: Path, write: bool
) -> JobSpec:
    """--stage / --stage-out: planned, checked against the node-local space, then packed
    (only when `write`: a dry-run writes nothing)."""
    if not values.get("stage") and not values.get("stage_out"):
        return spec
    if profile.kind == "slurm" and discover.in_allocation():
        raise UserError(
            "--stage",
            "staging inside an salloc allocation is not supported yet",
            "",
            "Submit the job from outside the allocation (hpclaunch run submits with sbatch)",
        )
    items = stage.plan(values.get("stage", ()), cwd, runs.absolute(spec.run_root, cwd))
    part = profile.partition(spec.partition)
    space = (part.local_disk_mb if part else None) or profile.node.local_disk_mb
    node_mem = (part.memory_mb if part and part.memory_mb else None) or profile.node.memory_mb
    ram: Optional[int] = None
    if profile.local_is_ram:
        if spec.mem_mb:
            ram = spec.mem_mb
        elif spec.mem_per_gpu_mb and spec.gpus_per_node:
            ram = spec.mem_per_gpu_mb * spec.gpus_per_node
        else:
            ram = node_mem
    where = f"nodes of {spec.partition}" if part else f"{profile.name} nodes"
    stage.check_capacity(items, space, ram, where)
    if write:
        stage.pack_all(items)
    return replace(
        spec,
        stage=items,
        stage_out=stage.parse_stage_out(values.get("stage_out", ()), cwd),
        local_dir=profile.local_dir,
    )


def _with_container(
    spec: JobSpec,
    profile: Profile,
    values: Mapping[str, Any],
    environ: Mapping[str, str],
    cwd: Path,
) -> tuple[JobSpec, list[str]]:
    """--container, --bind, --venv: the image, its binds and the venv, all checked."""
    venv = str(runs.absolute(str(values["venv"]), cwd)) if values.get("venv") else ""
    ckpt = spec.checkpoint_root
    own = [
        ("run", str(runs.absolute(spec.run_root, cwd))),
        ("checkpoints", str(runs.absolute(ckpt, cwd)) if ckpt else ""),
        ("project", str(project_root(cwd))),
        ("cwd", str(cwd)),
        ("venv", venv),
    ]
    job = containers.resolve(
        profile, values, environ, cwd, nodes=spec.nodes, gpus=spec.gpus_per_node, own=own
    )
    warnings: list[str] = []
    if venv:
        venv, warnings = venvs.check_venv(venv, job)
    if job is not None:
        job = containers.check_mount_points(job, profile.container)
        job = containers.with_staged_images(job, spec.stage)
        line = venvs.shadow_warning(job, venv, profile.python, environ)
        if line:
            warnings.append(line)
    return replace(spec, container=job, venv=venv), warnings


def _with_discovered(profile: Profile) -> Profile:
    """Fill partitions the profile does not describe from sinfo (profile facts win)."""
    if discover.slurm_config() is None:
        raise UserError(
            "--cluster",
            f"{profile.name} needs a Slurm controller, and none answers",
            "scontrol show config failed",
            "Check SLURM_CONF / the cluster, or use --cluster local",
        )
    found = dict(discover.partitions())
    merged = {**found, **profile.partitions}
    return profile.model_copy(
        update={"partitions": merged, "cluster_name": discover.cluster_name()}
    )


def project_root(cwd: Path) -> Path:
    """The git top-level folder (found without running git), else cwd."""
    for folder in (cwd, *cwd.parents):
        if (folder / ".git").exists():
            return folder
    return cwd


def project_name(cwd: Path) -> str:
    """The git top-level folder's name, else cwd's name."""
    return project_root(cwd).name or "project"


def git_state(cwd: Path) -> dict[str, str]:
    """Commit and dirtiness of the project, recorded with the run (empty outside git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
        if head.returncode != 0:
            return {}
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return {"commit": head.stdout.strip(), "dirty": str(bool(dirty.stdout.strip())).lower()}
    except (OSError, subprocess.TimeoutExpired):
        return {}
