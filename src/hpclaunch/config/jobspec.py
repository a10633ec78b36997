"""JobSpec: one resolved, validated, immutable request. No I/O here.

`config.resolve()` builds it from the layers and checks it against the cluster
profile; everything downstream (render, launchers, backends) only reads it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Optional

from hpclaunch.config.options import sbatch_line
from hpclaunch.config.secretnames import is_secret as is_secret  # re-exported: records, attach
from hpclaunch.config.secretnames import masked, secret_values

Launcher = Literal["srun", "torchrun"]
Visibility = Literal["all", "per-task"]

MASK = "***"


@dataclass(frozen=True)
class Bind:
    """One host path made visible inside the container."""

    src: str
    dst: str
    ro: bool = False
    origin: str = "you"  # you | profile | run | project | cwd | venv | stage
    image: bool = False  # a SquashFS file mounted as a folder (Apptainer's image-src=/)

    def spec(self) -> str:
        """Apptainer's -B item: the bare path when it lands at the same place (LUMI's form)."""
        if self.image:
            return f"{self.src}:{self.dst}:image-src=/"
        if self.src == self.dst and not self.ro:
            return self.src
        return f"{self.src}:{self.dst}" + (":ro" if self.ro else "")


@dataclass(frozen=True)
class ContainerJob:
    """A job's container, resolved and checked on the submitting host (containers.py)."""

    runtime: str  # apptainer | charliecloud | pyxis | ce | podman-hpc
    command: str  # apptainer, singularity, ch-run, srun (pyxis, ce) or podman-hpc
    image: str  # absolute path (podman-hpc: an image name in its storage)
    binds: tuple[Bind, ...] = ()
    flags: tuple[str, ...] = ()
    activate: str = ""
    cwd: str = ""
    pass_env: tuple[str, ...] = ()
    # Destinations missing in a directory image the user may write: made before submitting.
    mount_points: tuple[str, ...] = ()
    # The CSCS Container Engine's EDF: what it inherits and its annotations (runtimes.py).
    base_environment: tuple[str, ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    # The profile's image_broadcast_min_nodes: fewer nodes read the image file per node.
    broadcast_min_nodes: int = 8


@dataclass(frozen=True)
class StageItem:
    """One --stage source, packed (or used as is) on the submitting side."""

    name: str  # NAME in HPCLAUNCH_DATA_<NAME>
    src: str  # absolute source path
    kind: str  # directory | file | archive | squashfs
    archive: str  # what each node unpacks: the cached tar, or the source archive itself
    size: int  # bytes once unpacked on a node (an estimate for compressed archives)
    file: str = ""  # for a single file: its name inside the unpacked folder


@dataclass(frozen=True)
class Requeue:
    """--requeue: the ranks get `signal` `before_s` seconds before the time limit, then the
    job is queued again while fewer than `max_requeues` requeues happened."""

    max_requeues: int = 3
    signal: str = "USR2"
    before_s: int = 120
    margin_s: int = 15  # kept back from before_s for stage-out and `scontrol requeue`

    @property
    def grace_s(self) -> int:
        """How long the ranks may take to exit once signalled."""
        return self.before_s - self.margin_s


@dataclass(frozen=True)
class Profiling:
    """--profile-ranks/--profiler: which ranks run under which profiler (profiling.py)."""

    ranks: tuple[int, ...]
    tool: str  # py-spy | nsys | rocprof | torch
    pyspy: str = ""  # py-spy: this side's binary, copied into the run folder at submission


@dataclass(frozen=True)
class Parts:
    """What the features add to a checked request (planning/preparing.py), each typed: the code
    snapshot, --after's dependency, staging, the container and the venv."""

    snapshot: bool = False
    snapshot_limit_bytes: int = 200 * 2**20  # 0: no limit
    dependency: str = ""
    stage: tuple[StageItem, ...] = ()
    stage_out: tuple[tuple[str, str], ...] = ()
    local_dir: str = ""
    container: Optional[ContainerJob] = None
    venv: str = ""
    venv_image: str = ""  # a packed venv's SquashFS file, mounted at `venv` on the nodes


NO_PARTS = Parts()


@dataclass(frozen=True)
class JobSpec:
    cluster: str
    program: tuple[str, ...]
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    mem_mb: Optional[int] = None  # per node; 0 = all of it
    mem_per_gpu_mb: Optional[int] = None
    time_s: Optional[int] = None
    partition: str = ""
    account: str = ""
    # Plain Slurm flags (options.py rows of kind "sbatch": --reservation, --qos, ...):
    # (option name, checked value), each one #SBATCH line in the profile's spelling.
    slurm_flags: tuple[tuple[str, str], ...] = ()
    # The profile's [sbatch_lines]: option name -> its #SBATCH line on this site ("{}": value).
    sbatch_spellings: tuple[tuple[str, str], ...] = ()
    exclusive: bool = False
    overcommit: bool = False  # Slurm's --overcommit: more tasks than cores (job and step)
    node_logs: bool = False  # one log file a node (profile's node_logs_above), not a rank
    job_name: str = ""
    launcher: Launcher = "srun"
    gpu_visibility: Visibility = "all"
    exp: str = "default"
    project: str = ""  # the git top-level folder's name (else the working folder's)
    env: tuple[tuple[str, str], ...] = ()
    setup: tuple[str, ...] = ()
    sbatch_args: tuple[str, ...] = ()
    run_root: str = "runs"
    share: str = "private"  # private | group: the modes of what hpclaunch writes (filemodes)
    checkpoint_root: str = ""
    nccl_debug: bool = False
    profiling: Optional[Profiling] = None
    # Seconds between two GPU samples of the per-node watch; 0: no watch (no GPUs asked,
    # --no-watch, or a backend that does not start it).
    watch_interval_s: float = 0.0
    # The watch's judged window and warm-up (--watch-window/--watch-warmup); None: its default.
    watch_window_s: Optional[float] = None
    watch_warmup_s: Optional[float] = None
    cpu_bind: str = ""  # the --cpu-bind value srun gets, "" = Slurm's default
    container: Optional[ContainerJob] = None
    venv: str = ""  # absolute path of a venv every task activates
    # A packed venv (`hpclaunch env pack`): its SquashFS file, mounted at `venv` on the nodes.
    venv_image: str = ""
    stage: tuple[StageItem, ...] = ()
    stage_out: tuple[tuple[str, str], ...] = ()  # (SRC relative to HPCLAUNCH_LOCAL, absolute DEST)
    # The folder every node's tasks use for staged data ($HPCLAUNCH_LOCAL), as shell text.
    local_dir: str = ""
    snapshot: bool = False  # run from a copy of the project's code made at submission
    snapshot_limit_bytes: int = 200 * 2**20  # 0: no limit
    requeue: Optional[Requeue] = None  # --requeue: signal -> checkpoint -> requeue
    chain: int = 1  # --chain K: K jobs one after the other (1: no chain)
    preflight: bool = False  # --preflight: the nodes checked before the ranks start
    spares: int = 0  # --spares S: S nodes more than `nodes`, for a lost node's ranks
    dependency: str = ""  # sbatch --dependency for --after (runs still active), "" none
    # Where each setting came from, for the dry-run ("cli", "project", "env:SBATCH_ACCOUNT", ...)
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def ntasks(self) -> int:
        """Slurm tasks: one per rank under srun, one per node under torchrun."""
        return self.nodes * (1 if self.launcher == "torchrun" else self.tasks_per_node)

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    def gpu_request_line(self) -> str:
        """The GPU request's #SBATCH line as the site spells it: per node ("{}"), for the
        job ("{total}", Isambard-AI's --gpus) or per task ("{per_task}", Alps')."""
        per_node = self.gpus_per_node
        per_task = per_node // max(1, self.ntasks // self.nodes)
        spellings = dict(self.sbatch_spellings)
        total = str(per_node * self.nodes)
        return sbatch_line("gpus-per-node", str(per_node), spellings, total, str(per_task))

    def public_env(self) -> list[tuple[str, str]]:
        return [(k, v) for k, v in self.env if not is_secret(k)]

    def secret_env(self) -> list[tuple[str, str]]:
        return [(k, v) for k, v in self.env if is_secret(k)]

    def masked_secrets(self) -> list[tuple[str, str]]:
        """The secret values hidden wherever hpclaunch records text: as $NAME."""
        return secret_values(self.env)

    def to_record(self) -> dict[str, Any]:
        """JSON-ready, with secret values masked (this is what spec.json holds): $NAME
        where a secret's value appears in the program, a --setup line or any other text."""
        data = asdict(self)
        data["env"] = {k: (MASK if is_secret(k) else v) for k, v in self.env}
        data["sources"] = dict(self.sources)
        out: dict[str, Any] = masked(data, self.masked_secrets())
        return out
