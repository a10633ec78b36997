"""The typed registry of `run` options: one table that drives the CLI flags, the
`hpclaunch.toml [run]` keys, the API's keywords (api.run, kept equal by test_api), the
help text and, for a Slurm flag, its `#SBATCH` line (so they never disagree).

The table IS the typed options object: each field of `RunOptions` is one row (its
`Option` in the field's metadata), so config/layering.py builds one frozen `RunOptions` and
everything past it reads typed attributes, never string keys. A plain Slurm flag
(kind "sbatch": --reservation, --qos, ...) is one row and nothing else: its value is
checked against the row's pattern (`slurm_lines`) and written as the row's `line`, which
a cluster profile may respell for its site (`[sbatch_lines]`, profiles.py). The table
must stay one file: split, a row could no longer be the one place an option is declared.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Optional

from hpclaunch.errors import UserError, show

Kind = Literal["int", "float", "str", "time", "mem", "flag", "list", "choice", "sbatch"]


@dataclass(frozen=True)
class Option:
    name: str  # long name without dashes; also the [run] key in hpclaunch.toml
    kind: Kind
    help: str
    example: str = ""
    short: str = ""
    choices: tuple[str, ...] = ()
    metavar: str = ""
    # The #SBATCH spelling, "{}" for the value ("--qos={}"); a profile may respell it.
    line: str = ""
    pattern: str = ""  # kind "sbatch": what a value must match (no blanks: sbatch splits)
    allowed: str = ""  # kind "sbatch": that pattern in words, for the error line

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


def _row(
    kind: Kind,
    help: str,
    example: str = "",
    *,
    short: str = "",
    metavar: str = "",
    choices: tuple[str, ...] = (),
    line: str = "",
    pattern: str = "",
    allowed: str = "",
) -> Any:
    """One registry row as a field of RunOptions: not given is None (False for a flag,
    () for a list); the row itself rides in the field's metadata (named by the field)."""
    row = {"kind": kind, "help": help, "example": example, "short": short,
           "metavar": metavar, "choices": choices, "line": line, "pattern": pattern,
           "allowed": allowed}  # fmt: skip
    default: Any = False if kind == "flag" else () if kind == "list" else None
    return field(default=default, metadata={"row": row})


@dataclass(frozen=True)
class RunOptions:
    """Every `run` option, typed (times in seconds, sizes in MB, --snapshot-limit in
    bytes), as the layers gave them (config/layering.py); None/False/(): not given."""

    cluster: Optional[str] = _row(
        "str",
        "Cluster profile: local, slurm, lumi or one of yours. Default: the project "
        "file's, else lumi on LUMI, else slurm when a Slurm controller answers, else "
        "local.",
        "--cluster lumi",
        metavar="NAME",
    )
    nodes: Optional[int] = _row(
        "int",
        "Number of nodes.",
        "-N 2",
        short="-N",
        metavar="N",
    )
    tasks_per_node: Optional[int] = _row(
        "int",
        "Ranks per node (default: one per GPU, else 1).",
        "--tasks-per-node 4",
        metavar="T",
    )
    gpus_per_node: Optional[int] = _row(
        "int",
        "GPUs per node (LUMI: GCDs; default 8 on whole-node partitions such as standard-g"
        " or with --exclusive, 1 on small-g and dev-g).",
        "--gpus-per-node 8",
        metavar="G",
        line="--gpus-per-node={}",
    )
    cpus_per_task: Optional[int] = _row(
        "int",
        "CPU cores per rank; also sets OMP_NUM_THREADS unless you set it.",
        "--cpus-per-task 7",
        metavar="C",
    )
    mem: Optional[int] = _row(
        "mem",
        "Memory per node in Slurm's format; 0 means all of it.",
        "--mem 480G",
        metavar="SIZE",
    )
    mem_per_gpu: Optional[int] = _row(
        "mem",
        "Memory per GPU (LUMI default 60G).",
        "--mem-per-gpu 60G",
        metavar="SIZE",
    )
    time: Optional[int] = _row(
        "time",
        "Time limit: minutes, MM:SS, HH:MM:SS or D-HH:MM:SS (-t 5 is five minutes; on Slurm "
        "at least 1 minute).",
        "-t 1:00:00",
        short="-t",
        metavar="TIME",
    )
    partition: Optional[str] = _row(
        "str",
        "Slurm partition (default: the cluster's).",
        "-p standard-g",
        short="-p",
        metavar="NAME",
    )
    account: Optional[str] = _row(
        "str",
        "Slurm account (LUMI: project_NNNNNNNNN; required there). SBATCH_ACCOUNT is used "
        "when not given.",
        "-A project_465000000",
        short="-A",
        metavar="ACCOUNT",
    )
    reservation: Optional[str] = _row(
        "sbatch",
        "Slurm reservation. SBATCH_RESERVATION is used when not given.",
        "--reservation AI_workshop",
        metavar="NAME",
        line="--reservation={}",
        pattern="^[A-Za-z0-9_.,-]+$",
        allowed="a reservation name: letters, digits, . _ - (several: commas)",
    )
    qos: Optional[str] = _row(
        "sbatch",
        "Slurm quality of service (the site's QOS names: sacctmgr show qos).",
        "--qos normal",
        short="-q",
        metavar="NAME",
        line="--qos={}",
        pattern="^[A-Za-z0-9_.-]+$",
        allowed="a QOS name: letters, digits, . _ -",
    )
    constraint: Optional[str] = _row(
        "sbatch",
        "Only nodes with these features (Slurm's --constraint: a feature, or features "
        "joined by & | , with [] and *N counts).",
        "--constraint a100",
        short="-C",
        metavar="FEATURES",
        line="--constraint={}",
        pattern="^[A-Za-z0-9_.,&|*\\[\\]()!:-]+$",
        allowed="feature names joined by & | , with [ ] ( ) * ! :",
    )
    exclude: Optional[str] = _row(
        "sbatch",
        "Never these nodes (a Slurm host list: node1,node2 or nid[001-004]).",
        "--exclude node1",
        short="-x",
        metavar="HOSTS",
        line="--exclude={}",
        pattern="^[A-Za-z0-9_.,\\[\\]-]+$",
        allowed="a host list: names, commas, [ranges]",
    )
    nodelist: Optional[str] = _row(
        "sbatch",
        "Only these nodes (a Slurm host list: node1,node2 or nid[001-004]); the job needs"
        " at least as many nodes as listed.",
        "--nodelist node2",
        short="-w",
        metavar="HOSTS",
        line="--nodelist={}",
        pattern="^[A-Za-z0-9_.,\\[\\]-]+$",
        allowed="a host list: names, commas, [ranges]",
    )
    exclusive: bool = _row(
        "flag",
        "Whole nodes for this job alone (enables CPU binding on partial-node partitions).",
        "--exclusive",
    )
    overcommit: bool = _row(
        "flag",
        "More ranks per node than it has cores: Slurm's own --overcommit for the job and"
        " its step (up to Slurm's MaxTasksPerNode, 512 by default).",
        "--overcommit",
    )
    job_name: Optional[str] = _row(
        "str",
        "Slurm job name (default: the program's name).",
        "-J pretrain",
        short="-J",
        metavar="NAME",
    )
    launcher: Optional[Literal["srun", "torchrun"]] = _row(
        "choice",
        "srun: one task per rank. torchrun: one torchrun agent per node starting the ranks.",
        "--launcher torchrun",
        choices=("srun", "torchrun"),
    )
    gpu_visibility: Optional[Literal["all", "per-task"]] = _row(
        "choice",
        "all: every rank sees the node's GPUs and picks LOCAL_RANK. per-task: each rank "
        "sees only its own GPU as device 0.",
        "--gpu-visibility per-task",
        choices=("all", "per-task"),
    )
    exp: Optional[str] = _row(
        "str",
        "Experiment name: runs go to <run-root>/<exp>/<run-id>/.",
        "--exp sweep1",
        metavar="NAME",
    )
    run_root: Optional[str] = _row(
        "str",
        "Folder that holds the run directories (default ./runs; on Slurm sites with "
        "$SCRATCH: $SCRATCH/<project>; LUMI: /scratch/<account>/$USER/hpclaunch).",
        "--run-root /scratch/p/runs",
        metavar="DIR",
    )
    share: Optional[Literal["private", "group"]] = _row(
        "choice",
        "Who may read the run folders hpclaunch makes: private (0700/0600, the default) "
        "or group (0750/0640, for a team); never others. Default: the profile's.",
        "--share group",
        choices=("private", "group"),
    )
    env: tuple[str, ...] = _row(
        "list",
        "Set a variable for every rank (repeatable); --env NAME takes NAME's value here. "
        "Secret names (a segment KEY, TOKEN, SECRET, PASSWORD, PASS, PAT, ...) never "
        "reach a file: only the job's environment.",
        "--env WANDB_PROJECT=demo",
        metavar="KEY=VALUE",
    )
    setup: tuple[str, ...] = _row(
        "list",
        "A shell line run in the batch script before the launch (repeatable).",
        "--setup 'module load LUMI/24.03'",
        metavar="LINE",
    )
    sbatch_arg: tuple[str, ...] = _row(
        "list",
        "An sbatch option hpclaunch does not model, passed on (repeatable).",
        "--sbatch-arg=--mail-type=END",
        metavar="ARG",
    )
    container: Optional[str] = _row(
        "str",
        "Run every task inside this image: a path (SIF, SquashFS, directory), a name in "
        "the profile's image folders (LUMI: /appl/local/containers/sif-images), or $SIF "
        "as set by a container module.",
        "--container lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif",
        metavar="IMAGE",
    )
    container_runtime: Optional[
        Literal["apptainer", "charliecloud", "pyxis", "ce", "podman-hpc"]
    ] = _row(
        "choice",
        "Container runtime (default: the profile's; LUMI: apptainer, found as singularity): "
        "pyxis (srun --container-image), ce (CSCS Container Engine: srun --environment), "
        "podman-hpc (NERSC).",
        "--container-runtime charliecloud",
        choices=("apptainer", "charliecloud", "pyxis", "ce", "podman-hpc"),
    )
    bind: tuple[str, ...] = _row(
        "list",
        "Bind a host path into the container, SRC[:DST[:ro]] (repeatable). The run "
        "directory, the project and the profile's binds are added for you.",
        "--bind /scratch/project_465000000/data:/data:ro",
        metavar="SRC[:DST[:ro]]",
    )
    venv: Optional[str] = _row(
        "str",
        "Activate this venv in every task (made by `hpclaunch env create` for the same image).",
        "--venv /project/project_465000000/venvs/torch",
        metavar="PATH",
    )
    stage: tuple[str, ...] = _row(
        "list",
        "Put data on every node before the ranks start (repeatable): a folder (packed "
        "once into a cached tar), a file, an archive (.tar, .tar.gz, .tar.zst) or a "
        "SquashFS image. Ranks find it at $HPCLAUNCH_DATA_<NAME> (NAME: SRC's base name, "
        "upper-cased) in the node-local $HPCLAUNCH_LOCAL, removed when the job ends.",
        "--stage ./imagenet-subset:DATA",
        metavar="SRC[:NAME]",
    )
    stage_out: tuple[str, ...] = _row(
        "list",
        "Copy SRC (relative to $HPCLAUNCH_LOCAL) to DEST when the job ends, also after a "
        "failure or the time limit; DEST/<node>/ per node on more than one node.",
        "--stage-out out:results",
        metavar="SRC:DEST",
    )
    no_snapshot: bool = _row(
        "flag",
        "Do not copy the project's code into the run directory (on clusters the job "
        "otherwise runs from that snapshot, so later edits never change it).",
        "--no-snapshot",
    )
    snapshot_limit: Optional[int] = _row(
        "mem",
        "Largest code snapshot, a Slurm size: 64K, 500M, 2G (a plain number is MB; 0: no "
        "limit; default 200M). A bigger one is refused, naming the largest files.",
        "--snapshot-limit 500M",
        metavar="SIZE",
    )
    nccl_debug: bool = _row(
        "flag",
        "Add the profile's NCCL/RCCL debug variables (LUMI: NCCL_DEBUG=INFO, per-rank "
        "NCCL_DEBUG_FILE on node-local /tmp).",
        "--nccl-debug",
    )
    profile_ranks: Optional[str] = _row(
        "str",
        "Run these ranks (comma-separated) under --profiler, inside the container where "
        "they run; output in <run>/profiles/rank-R.* (docs/profiling.md).",
        "--profile-ranks 0,14",
        metavar="R,R,...",
    )
    profiler: Optional[Literal["py-spy", "nsys", "rocprof", "torch"]] = _row(
        "choice",
        "The profiler of --profile-ranks: py-spy (speedscope JSON; shipped with the run),"
        " nsys, rocprof (--stats), or torch (the program's own torch.profiler, told by "
        "HPCLAUNCH_PROFILE=1 and HPCLAUNCH_PROFILE_DIR).",
        "--profiler py-spy",
        choices=("py-spy", "nsys", "rocprof", "torch"),
    )
    no_watch: bool = _row(
        "flag",
        "Do not sample the GPUs. A job that asks for GPUs runs a GPU watch on each node "
        "beside the ranks (nvidia-smi, rocm-smi or amd-smi): metrics/gpu-<node>.csv, "
        "`hpclaunch top` and `plot`, and a warning when GPUs sit idle waiting for data.",
        "--no-watch",
    )
    watch_interval: Optional[float] = _row(
        "float",
        "Seconds between two GPU samples (default 2; 0.5 to 600).",
        "--watch-interval 5",
        metavar="SECONDS",
    )
    watch_window: Optional[float] = _row(
        "float",
        "Seconds of GPU samples the watch judges for its input-bound warning (default "
        "120; 5 to 86400).",
        "--watch-window 60",
        metavar="SECONDS",
    )
    watch_warmup: Optional[float] = _row(
        "float",
        "Seconds after the watch's first sample before it judges at all (default 60; 0 to 86400).",
        "--watch-warmup 30",
        metavar="SECONDS",
    )
    requeue: bool = _row(
        "flag",
        "Outlive the time limit: shortly before it, pass --requeue-signal to the ranks "
        "(save a checkpoint in $HPCLAUNCH_CHECKPOINT_DIR), wait for them, and queue the "
        "job again; the next attempt sees HPCLAUNCH_RESUME=1 (docs/resumable.md).",
        "--requeue",
    )
    max_requeues: Optional[int] = _row(
        "int",
        "With --requeue: how many times the job may be queued again, Slurm's own requeues"
        " (node failure, preemption) included (default 3: up to 4 attempts).",
        "--max-requeues 10",
        metavar="N",
    )
    requeue_signal: Optional[Literal["USR2", "USR1"]] = _row(
        "choice",
        "With --requeue: the signal the ranks get before the time limit (default USR2; "
        "NCCL takes USR1 for itself).",
        "--requeue-signal USR1",
        choices=("USR2", "USR1"),
    )
    signal_before: Optional[int] = _row(
        "int",
        "With --requeue: seconds before the time limit at which the signal is sent "
        "(default 120; Slurm may send it up to a minute earlier). The ranks get this "
        "minus 15 s to exit.",
        "--signal-before 300",
        metavar="SECONDS",
    )
    after: tuple[str, ...] = _row(
        "list",
        "Start only after RUN ended: RUN[:ok] (completed), RUN:any, RUN:notok "
        "(repeatable). RUN: a run id, job id, last, or a sweep (all its points). A "
        "dependency that can never be met is refused, or ends the job instead of leaving "
        "it pending.",
        "--after last:ok",
        metavar="RUN[:COND]",
    )
    chain: Optional[int] = _row(
        "int",
        "Submit K jobs of this run, each after the previous one ended, sharing one "
        "checkpoint folder (past the time limit where requeue is not allowed); the chain "
        "stops early once the program writes $HPCLAUNCH_DONE_FILE.",
        "--chain 3",
        metavar="K",
    )
    preflight: bool = _row(
        "flag",
        "Check every node before the program starts (GPUs visible and usable, node-local "
        "space, a small all-reduce among the nodes, the container starting); a node that "
        "fails is named in the record and the ranks avoid it (docs/scale.md).",
        "--preflight",
    )
    spares: Optional[int] = _row(
        "int",
        "Ask for N more nodes: the ranks start on the others (not on the batch host while "
        "a spare is left) and, when a node fails, start again on a spare in the same job "
        "with HPCLAUNCH_RESUME=1 (docs/scale.md).",
        "--spares 1",
        metavar="N",
    )


OPTIONS: tuple[Option, ...] = tuple(
    Option(name=f.name.replace("_", "-"), **f.metadata["row"]) for f in fields(RunOptions)
)
BY_NAME = {opt.name: opt for opt in OPTIONS}
SLURM_FLAGS = tuple(opt for opt in OPTIONS if opt.kind == "sbatch")


def slurm_lines(options: RunOptions) -> tuple[tuple[str, str], ...]:
    """The plain Slurm flags given, as (option name, value), each value checked against
    its row: a bad one is refused in one line before anything is submitted."""
    given = []
    for opt in SLURM_FLAGS:
        value = getattr(options, opt.dest)
        if not value:
            continue
        if not re.fullmatch(opt.pattern, value):  # re.match would let "x\n" through
            raise UserError(
                f"--{opt.name}",
                f"{show(value)} is not allowed",
                opt.allowed,
                f"Use e.g. {opt.example}",
            )
        given.append((opt.name, str(value)))
    return tuple(given)


def sbatch_line(
    name: str, value: str, spellings: Mapping[str, str], total: str = "", per_task: str = ""
) -> str:
    """Row `name`'s #SBATCH line for `value`, as the site spells it (`spellings`: a
    profile's [sbatch_lines]) or as the row does; a per-node count may be spelled as the
    job's `total` ("{total}") or per task ("{per_task}")."""
    line = spellings.get(name, BY_NAME[name].line)
    line = line.replace("{total}", total).replace("{per_task}", per_task)
    return "#SBATCH " + line.replace("{}", value)
