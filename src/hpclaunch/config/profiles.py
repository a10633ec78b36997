"""Cluster profiles as data: the model, the built-in TOML files, user and project layers.

A profile says what a cluster is (partitions and their limits, node shape, GPU->core
topology), where runs live, and what every job there needs (environment, cache
folders, CPU binding). Profiles are layered: built-in < ~/.config/hpclaunch/clusters/
NAME.toml < the project's [clusters.NAME]; later layers override keys of earlier ones.

The records are frozen dataclasses validated like pydantic models (`X.model_validate(data)`,
datarecords.py), pydantic itself only for data not already of its fields' exact types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

from hpclaunch.basics.units import parse_memory, parse_time
from hpclaunch.config.datarecords import _field, _Record
from hpclaunch.config.tomlfiles import loads, merge, read_toml
from hpclaunch.errors import UserError, show

if TYPE_CHECKING:
    from hpclaunch.config.topology import Topology

# The sites with a built-in profile (docs/sites.md: each one's facts and sources).
SITES = ("lumi", "alps", "juwels-booster", "jupiter", "leonardo", "marenostrum5", "perlmutter",
         "isambard-ai", "jean-zay", "frontier")  # fmt: skip
BUILTIN = ("local", "slurm", *SITES)


# Conversions before validation; `cls` first, as pydantic's field validators.
def _time(cls: Any, value: Any) -> Any:
    return parse_time(value, "max_time") if isinstance(value, str) else value


def _default_time(cls: Any, value: Any) -> Any:
    return parse_time(value, "default_time") if isinstance(value, str) else value


def _poll_floor(cls: Any, value: Any) -> Any:
    """min_poll_interval: whole seconds, at least 0 (waiting.py: every wait obeys it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        whole = False
    else:
        whole = float(value).is_integer()  # inf and nan are not
    if not whole:
        raise UserError(
            "min_poll_interval",
            f"{show(value)} is not a number of seconds",
            "a whole number, 0 or more",
            "Write e.g. min_poll_interval = 60",
        )
    return int(value)


def _node_logs_above(cls: Any, value: Any) -> Any:
    """node_logs_above: a rank count, 0 or more (0: node files for every job)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(
            "node_logs_above",
            f"{show(value)} is not a rank count",
            "a whole number, 0 or more",
            "Write e.g. node_logs_above = 64",
        )
    return value


def _image_broadcast_min_nodes(cls: Any, value: Any) -> Any:
    """image_broadcast_min_nodes: a node count, 1 or more (2 or fewer: every multi-node job)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(
            "image_broadcast_min_nodes",
            f"{show(value)} is not a node count",
            "a whole number, 1 or more",
            "Write e.g. image_broadcast_min_nodes = 8",
        )
    return value


def _memory(cls: Any, value: Any) -> Any:
    return parse_memory(value, "node.memory") if isinstance(value, str) else value


@dataclass(frozen=True)
class Partition(_Record):
    max_time: Optional[int] = _field(before=_time)  # seconds; None = no limit
    default_time: Optional[int] = _field(before=_default_time)  # Slurm's DefaultTime, if known
    # GPUs per node without --gpus-per-node; None: see resources.default_gpus.
    gpus_default: Optional[int] = None
    max_nodes: Optional[int] = None  # per job
    nodes: Optional[int] = None  # nodes in the partition (from sinfo)
    whole_node: bool = False
    cpus: Optional[int] = None  # per node, overriding the profile's node shape
    gpus: Optional[int] = None
    memory_mb: Optional[int] = None
    local_disk_mb: Optional[int] = None  # sinfo's TmpDisk
    default: bool = False


@dataclass(frozen=True)
class NodeShape(_Record):
    cpus: Optional[int] = None
    usable_cpus: Optional[int] = None
    gpus: int = 0
    memory_mb: Optional[int] = _field(alias="memory", before=_memory)
    cpus_per_gpu: Optional[int] = None
    # Node-local space for staged data (--stage); None = unknown (not checked).
    local_disk_mb: Optional[int] = _field(alias="local_disk", before=_memory)


@dataclass(frozen=True)
class ContainerBind(_Record):
    """One bind a profile adds to every container job (LUMI: the multi-node set)."""

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


# Host variables that cross into the container besides the job's own (NAME or PREFIX*):
# the ones ML programs and their libraries read. --env adds any other.
PASS_ENV = (
    *("USER", "LOGNAME", "LANG", "LC_*", "TZ", "TERM", "WANDB_*", "HF_*", "HUGGING_FACE_*"),
    *("MLFLOW_*", "COMET_*", "NEPTUNE_*", "TORCH_*", "TORCHINDUCTOR_*", "TRITON_*", "JAX_*"),
    *("XLA_*", "TF_*", "NCCL_*", "RCCL_*", "MIOPEN_*", "FI_*", "CXI_*", "CUDA_*", "ROCR_*"),
    *("HIP_*", "HSA_*", "OMP_*", "MKL_*", "OPENBLAS_*"),
)


@dataclass(frozen=True)
class ContainerSettings(_Record):
    """How a site runs containers: the runtime, where images live, what every job binds."""

    runtime: Literal["apptainer", "charliecloud", "pyxis", "ce", "podman-hpc"] = "apptainer"
    # The runtime's program; "" = apptainer, else singularity, whichever is on PATH.
    command: str = ""
    image_dirs: tuple[str, ...] = ()  # where a bare image name is looked up
    image_vars: tuple[str, ...] = ("SIF",)  # variables container modules set to an image
    flags: tuple[str, ...] = ()  # always given to the runtime
    gpu_flags: tuple[str, ...] = ()  # given when the job asks for GPUs (--nv on NVIDIA)
    # Shell text run inside the container before Python starts (LUMI: "$WITH_CONDA").
    activate: str = ""
    # The network plugin library the site's images must hold for fast collectives across
    # nodes (LUMI: librccl-net, from aws-ofi-rccl); `hpclaunch doctor` looks for it.
    network_plugin: str = ""
    binds: tuple[ContainerBind, ...] = ()
    pass_env: tuple[str, ...] = PASS_ENV
    # CSCS Container Engine only (docs.cscs.ch/software/container-engine/edf): the EDFs the
    # run's EDF inherits (base_environment) and its [annotations] (the site's hooks, e.g.
    # com.hooks.aws_ofi_nccl.enabled = "true").
    base_environment: tuple[str, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SiteRule(_Record):
    """A rule by which the site's Slurm rejects jobs, checked before sbatch
    (planning/siterules.py) and refused in the site's own `message`."""

    # min_cpus_per_gpu: at least `value` CPUs per GPU; require_qos: a job on `partition`
    # names a --qos; forbid_line: no #SBATCH line starting with `line`; qos_over_time: a
    # job longer than `value` seconds names --qos=`qos` (a QoS ladder: Jean Zay's).
    kind: Literal["min_cpus_per_gpu", "require_qos", "forbid_line", "qos_over_time"]
    message: str  # the site's wording
    source: str = ""  # where the site says it
    value: int = 0
    partition: str = ""  # "" = every partition
    line: str = ""
    qos: str = ""


@dataclass(frozen=True)
class RemoteSettings(_Record):
    """[remote]: how a laptop reaches the cluster (ignored on the login node: choose.py)."""

    host: str = ""
    login_hostnames: tuple[str, ...] = ()
    forward_env: tuple[str, ...] = ()  # laptop variables a run, sweep or rerun sends
    ship_limit: str = "2G"  # the most `--ship DIR` sends (a folder outside git)


@dataclass(frozen=True)
class Profile(_Record):
    name: str
    description: str = ""
    kind: Literal["local", "slurm"] = "slurm"
    discover: bool = False
    detect_cluster_names: tuple[str, ...] = ()
    account_required: bool = False
    account_pattern: str = ""
    run_root: str = "runs"
    share: Literal["private", "group"] = "private"  # who reads run folders (filemodes.py)
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
    # Where each node's private folder of the job ($HPCLAUNCH_LOCAL, made fresh with an
    # unpredictable name) is made, shell text evaluated on each node: the site's per-job
    # $SLURM_TMPDIR or $TMPDIR when it sets one, else /tmp.
    local_dir: str = "${SLURM_TMPDIR:-${TMPDIR:-/tmp}}"
    local_is_ram: bool = False  # /tmp in memory (LUMI): staged data counts against --mem
    stage_cache_keep: int = 2  # packs kept per source in <run-root>/.stage-cache
    stage_cache_max: str = "200G"  # all packs together; the least recently used go first
    node: NodeShape = NodeShape()
    topology: Optional[Topology] = None
    env: dict[str, str] = field(default_factory=dict)
    debug_env: dict[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()
    sbatch_args: tuple[str, ...] = ()
    # A row's #SBATCH line as this site spells it (options.py: a row with a `line`), "{}"
    # for the value: e.g. gpus-per-node = "--gres=gpu:{}" where --gpus-per-node is refused.
    sbatch_lines: dict[str, str] = field(default_factory=dict)
    partitions: dict[str, Partition] = field(default_factory=dict)
    container: ContainerSettings = ContainerSettings()
    cluster_name: str = ""  # filled by discovery
    wandb_credentials: str = ""  # a file holding the W&B API key (mode 600), e.g. seed 003's
    remote: RemoteSettings = RemoteSettings()
    # The fewest seconds between two status calls of any wait (run --wait, logs --follow,
    # Run.wait(), sweep wait, top): a site whose usage policy asks for fewer calls sets it.
    min_poll_interval: int = field(default=0, metadata={"before": _poll_floor})
    # Above this many ranks the ranks of a node share one log file (node-<node>.log, lines
    # tagged "[node rank]") instead of two files a rank: a file per rank floods a
    # parallel file system's metadata servers (docs/scale.md).
    node_logs_above: int = field(default=64, metadata={"before": _node_logs_above})
    # From this many nodes on, a --container image file is sent to every node with sbcast
    # (script/imagebcast.py). sbcast sends the whole file, while each node's runtime reads
    # only the blocks it touches: on the testbed 113 MiB sent against ~11 MiB read per node
    # (docs/benchmarks.md, image rows), so the broadcast pays from about 10 nodes on.
    image_broadcast_min_nodes: int = field(
        default=8, metadata={"before": _image_broadcast_min_nodes}
    )
    arch: Literal["x86_64", "aarch64"] = "x86_64"  # the compute nodes' CPUs (wheels, py-spy)
    # Appended to the first node's name for MASTER_ADDR (JSC: "i", the InfiniBand name).
    rendezvous_suffix: str = ""
    # hpclaunch dev (docs/interactive.md): a session's time limit when --time is not
    # given, and how long a session waits for a silent laptop's heartbeat (seconds).
    dev_time: str = "2:00:00"
    dev_heartbeat_timeout: int = 900
    rules: tuple[SiteRule, ...] = ()
    # Where each fact comes from (fact -> URL or repository path; docs/sites.md) and the
    # facts no public source confirmed (`hpclaunch profile show` marks them).
    sources: dict[str, str] = field(default_factory=dict)
    unverified: tuple[str, ...] = ()

    def partition(self, name: str) -> Optional[Partition]:
        return self.partitions.get(name)

    def default_partition_name(self) -> str:
        if self.default_partition:
            return self.default_partition
        for name, part in self.partitions.items():
            if part.default:
                return name
        return ""


def user_profile_dir(environ: Mapping[str, str]) -> Path:
    """Where a user's own profiles live (the request's environment decides)."""
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    base = environ.get("XDG_CONFIG_HOME") or str(home / ".config")
    return Path(base) / "hpclaunch" / "clusters"


def _builtin(name: str) -> dict[str, Any]:
    # A file beside this one, as bootstrap.py is (importlib.resources costs an import).
    text = (Path(__file__).with_name("clusters") / f"{name}.toml").read_text("utf-8")
    return loads(text, Path(name), "cluster profile")


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_name(name: str, field: str = "--cluster") -> None:
    """A profile's name: it becomes a file name in the user's clusters folder."""
    if not _NAME.match(name) or ".." in name:
        raise UserError(
            field,
            f"{show(name)} is not a cluster name",
            "letters, digits, . _ -; at most 64",
            "Use e.g. --cluster lumi",
        )


def load_profile(
    name: str,
    project_profiles: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Profile:
    """Built-in < user file < project table, validated into a Profile."""
    environ = {} if environ is None else environ
    check_name(name)
    data: dict[str, Any] = {}
    found = False
    if name in BUILTIN:
        data = _builtin(name)
        found = True
    user_file = user_profile_dir(environ) / f"{name}.toml"
    if user_file.is_file():
        data = merge(data, read_toml(user_file, "cluster profile"))
        found = True
    if project_profiles and name in project_profiles:
        data = merge(data, project_profiles[name])
        found = True
    if not found:
        users = list_user_profiles(environ)
        known = sorted(set(BUILTIN) | set(users) | set(project_profiles or {}))
        raise UserError(
            "--cluster",
            f"unknown cluster {show(name)}",
            f"known: {', '.join(known)}",
            f"Pick one, or describe it in {user_file}",
        )
    data.setdefault("name", name)
    try:
        return Profile.model_validate(data)
    except ValueError as exc:  # pydantic's ValidationError (pydantic is loaded by then)
        from pydantic import ValidationError

        if not isinstance(exc, ValidationError):
            raise
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UserError(
            f"cluster profile {name}: {where}",
            err["msg"],
            "",
            f"Fix the profile ({user_file} or hpclaunch.toml [clusters.{name}])",
        ) from None


def list_user_profiles(environ: Mapping[str, str]) -> list[str]:
    folder = user_profile_dir(environ)
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.toml"))


def gpus_on_node(profile: Profile, part: Optional[Partition]) -> int:
    """GPUs on a node of the partition (its own count, else the profile's node)."""
    if part and part.gpus is not None:
        return part.gpus
    return profile.node.gpus
