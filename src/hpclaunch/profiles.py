"""Cluster profiles as data: the model, the built-in TOML files, user and project layers.

A profile says what a cluster is (partitions and their limits, node shape, GPU->core
topology), where runs live, and what every job there needs (environment, cache
folders, CPU binding). Profiles are layered: built-in < ~/.config/hpclaunch/clusters/
NAME.toml < the project's [clusters.NAME]; later layers override keys of earlier ones.
"""

from __future__ import annotations

import os
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import UserError, show
from .topology import Topology
from .units import parse_memory, parse_time

BUILTIN = ("local", "slurm", "lumi")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 only
    import tomli as tomllib


class Partition(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_time: Optional[int] = None  # seconds; None = no limit
    max_nodes: Optional[int] = None  # per job
    nodes: Optional[int] = None  # nodes in the partition (from sinfo)
    whole_node: bool = False
    cpus: Optional[int] = None  # per node, overriding the profile's node shape
    gpus: Optional[int] = None
    memory_mb: Optional[int] = None
    local_disk_mb: Optional[int] = None  # sinfo's TmpDisk
    default: bool = False

    @field_validator("max_time", mode="before")
    @classmethod
    def _time(cls, value: Any) -> Any:
        return parse_time(value, "max_time") if isinstance(value, str) else value


class NodeShape(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    cpus: Optional[int] = None
    usable_cpus: Optional[int] = None
    gpus: int = 0
    memory_mb: Optional[int] = Field(default=None, alias="memory")
    cpus_per_gpu: Optional[int] = None
    # Node-local space for staged data (--stage); None = unknown (not checked).
    local_disk_mb: Optional[int] = Field(default=None, alias="local_disk")

    @field_validator("memory_mb", "local_disk_mb", mode="before")
    @classmethod
    def _mem(cls, value: Any) -> Any:
        return parse_memory(value, "node.memory") if isinstance(value, str) else value


class ContainerBind(BaseModel):
    """One bind a profile adds to every container job (LUMI: the multi-node set)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str  # on the host; also the destination unless `dst` is given
    dst: str = ""
    ro: bool = False
    multi_node: bool = False  # only for jobs on more than one node
    # Exists only on compute nodes (LUMI's /opt/cray, libcxi): never checked on the
    # submitting host, where it may well be missing.
    node_local: bool = False
    # Only when a path of the job (run dir, project, checkpoints, a bind) lies under one
    # of these (LUMI: /scratch and /flash are symlinks into /pfs).
    when_under: tuple[str, ...] = ()


class ContainerSettings(BaseModel):
    """How a site runs containers: the runtime, where images live, what every job binds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: Literal["apptainer", "charliecloud"] = "apptainer"
    # The runtime's program; "" = apptainer, else singularity, whichever is on PATH.
    command: str = ""
    image_dirs: tuple[str, ...] = ()  # where a bare image name is looked up
    image_vars: tuple[str, ...] = ("SIF",)  # variables container modules set to an image
    flags: tuple[str, ...] = ()  # always given to the runtime
    gpu_flags: tuple[str, ...] = ()  # given when the job asks for GPUs (--nv on NVIDIA)
    # Shell text run inside the container before Python starts (LUMI: "$WITH_CONDA").
    activate: str = ""
    binds: tuple[ContainerBind, ...] = ()
    # Host variables that cross into the container besides the job's own (NAME or PREFIX*):
    # the ones ML programs and their libraries read. --env adds any other.
    pass_env: tuple[str, ...] = (
        "USER",
        "LOGNAME",
        "LANG",
        "LC_*",
        "TZ",
        "TERM",
        "WANDB_*",
        "HF_*",
        "HUGGING_FACE_*",
        "MLFLOW_*",
        "COMET_*",
        "NEPTUNE_*",
        "TORCH_*",
        "TORCHINDUCTOR_*",
        "TRITON_*",
        "JAX_*",
        "XLA_*",
        "TF_*",
        "NCCL_*",
        "RCCL_*",
        "MIOPEN_*",
        "FI_*",
        "CXI_*",
        "CUDA_*",
        "ROCR_*",
        "HIP_*",
        "HSA_*",
        "OMP_*",
        "MKL_*",
        "OPENBLAS_*",
    )


class Profile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    kind: Literal["local", "slurm"] = "slurm"
    discover: bool = False
    detect_cluster_names: tuple[str, ...] = ()
    account_required: bool = False
    account_pattern: str = ""
    run_root: str = "runs"
    # Used instead of run_root when $SCRATCH is set (generic clusters: "{scratch}/{project}").
    scratch_run_root: str = ""
    checkpoint_root: str = ""
    default_partition: str = ""
    python: str = "python3"
    launcher: Literal["srun", "torchrun"] = "srun"
    gpu_visibility: Literal["all", "per-task"] = "all"
    gpu_vars: tuple[str, ...] = ("CUDA_VISIBLE_DEVICES",)
    gpu_unset: tuple[str, ...] = ()
    cpu_bind: Literal["mask", "map", "none"] = "none"
    cpu_bind_verbose: bool = True
    one_task_per_gpu: bool = False
    mem_per_gpu: Optional[str] = None
    cache_dirs: tuple[str, ...] = ()
    # The job's node-local folder ($HPCLAUNCH_LOCAL), shell text evaluated on each node:
    # the site's per-job $SLURM_TMPDIR when it sets one, else a folder in /tmp.
    local_dir: str = "${SLURM_TMPDIR:-/tmp/$USER-hpclaunch-$SLURM_JOB_ID}"
    local_is_ram: bool = False  # /tmp in memory (LUMI): staged data counts against --mem
    node: NodeShape = NodeShape()
    topology: Optional[Topology] = None
    env: dict[str, str] = {}
    debug_env: dict[str, str] = {}
    setup: tuple[str, ...] = ()
    sbatch_args: tuple[str, ...] = ()
    partitions: dict[str, Partition] = {}
    container: ContainerSettings = ContainerSettings()
    cluster_name: str = ""  # filled by discovery

    def partition(self, name: str) -> Optional[Partition]:
        return self.partitions.get(name)

    def default_partition_name(self) -> str:
        if self.default_partition:
            return self.default_partition
        for name, part in self.partitions.items():
            if part.default:
                return name
        return ""


def user_profile_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hpclaunch" / "clusters"


def read_toml(path: Path, field: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            data: dict[str, Any] = tomllib.load(handle)
            return data
    except OSError as exc:
        raise UserError(
            field, f"cannot read {path}: {exc.strerror}", "", "Check the path"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(field, f"{path} is not valid TOML: {exc}", "", "Fix the file") from None


def _builtin(name: str) -> dict[str, Any]:
    text = resources.files("hpclaunch.clusters").joinpath(f"{name}.toml").read_text("utf-8")
    data: dict[str, Any] = tomllib.loads(text)
    return data


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep merge of TOML tables: `over` wins key by key."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def load_profile(name: str, project_profiles: dict[str, Any] | None = None) -> Profile:
    """Built-in < user file < project table, validated into a Profile."""
    if not _NAME.match(name) or ".." in name:
        raise UserError(
            "--cluster",
            f"{show(name)} is not a cluster name",
            "letters, digits, . _ -; at most 64",
            "Use e.g. --cluster lumi",
        )
    data: dict[str, Any] = {}
    found = False
    if name in BUILTIN:
        data = _builtin(name)
        found = True
    user_file = user_profile_dir() / f"{name}.toml"
    if user_file.is_file():
        data = merge(data, read_toml(user_file, "cluster profile"))
        found = True
    if project_profiles and name in project_profiles:
        data = merge(data, project_profiles[name])
        found = True
    if not found:
        known = sorted(set(BUILTIN) | set(list_user_profiles()) | set(project_profiles or {}))
        raise UserError(
            "--cluster",
            f"unknown cluster {show(name)}",
            f"known: {', '.join(known)}",
            f"Pick one, or describe it in {user_file}",
        )
    data.setdefault("name", name)
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UserError(
            f"cluster profile {name}: {where}",
            err["msg"],
            "",
            f"Fix the profile ({user_file} or hpclaunch.toml [clusters.{name}])",
        ) from None


def list_user_profiles() -> list[str]:
    folder = user_profile_dir()
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.toml"))
