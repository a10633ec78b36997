"""The typed registry of `run` options: drives the CLI, `hpclaunch.toml [run]` keys and
their validation, and the help text (one table, so they never disagree)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["int", "float", "str", "time", "mem", "flag", "list", "choice"]


@dataclass(frozen=True)
class Option:
    name: str  # long name without dashes; also the [run] key in hpclaunch.toml
    kind: Kind
    help: str
    example: str = ""
    short: str = ""
    choices: tuple[str, ...] = ()
    metavar: str = ""

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option(
        "cluster",
        "str",
        "Cluster profile: local, slurm, lumi or one of yours. "
        "Default: the project file's, else lumi on LUMI, else slurm when a Slurm "
        "controller answers, else local.",
        "--cluster lumi",
        metavar="NAME",
    ),
    Option("nodes", "int", "Number of nodes.", "-N 2", short="-N", metavar="N"),
    Option(
        "tasks-per-node",
        "int",
        "Ranks per node (default: one per GPU, else 1).",
        "--tasks-per-node 4",
        metavar="T",
    ),
    Option(
        "gpus-per-node",
        "int",
        "GPUs per node (LUMI: GCDs; default 8 on whole-node partitions such as standard-g "
        "or with --exclusive, 1 on small-g and dev-g).",
        "--gpus-per-node 8",
        metavar="G",
    ),
    Option(
        "cpus-per-task",
        "int",
        "CPU cores per rank; also sets OMP_NUM_THREADS unless you set it.",
        "--cpus-per-task 7",
        metavar="C",
    ),
    Option(
        "mem",
        "mem",
        "Memory per node in Slurm's format; 0 means all of it.",
        "--mem 480G",
        metavar="SIZE",
    ),
    Option(
        "mem-per-gpu",
        "mem",
        "Memory per GPU (LUMI default 60G).",
        "--mem-per-gpu 60G",
        metavar="SIZE",
    ),
    Option(
        "time",
        "time",
        "Time limit: minutes, MM:SS, HH:MM:SS or D-HH:MM:SS (-t 5 is five minutes).",
        "-t 1:00:00",
        short="-t",
        metavar="TIME",
    ),
    Option(
        "partition",
        "str",
        "Slurm partition (default: the cluster's).",
        "-p standard-g",
        short="-p",
        metavar="NAME",
    ),
    Option(
        "account",
        "str",
        "Slurm account (LUMI: project_NNNNNNNNN; required there). "
        "SBATCH_ACCOUNT is used when not given.",
        "-A project_465000000",
        short="-A",
        metavar="ACCOUNT",
    ),
    Option("reservation", "str", "Slurm reservation.", "--reservation AI_workshop", metavar="NAME"),
    Option(
        "exclusive",
        "flag",
        "Whole nodes for this job alone (enables CPU binding on partial-node partitions).",
        "--exclusive",
    ),
    Option(
        "job-name",
        "str",
        "Slurm job name (default: the program's name).",
        "-J pretrain",
        short="-J",
        metavar="NAME",
    ),
    Option(
        "launcher",
        "choice",
        "srun: one task per rank. torchrun: one torchrun agent per node starting the ranks.",
        "--launcher torchrun",
        choices=("srun", "torchrun"),
    ),
    Option(
        "gpu-visibility",
        "choice",
        "all: every rank sees the node's GPUs and picks "
        "LOCAL_RANK. per-task: each rank sees only its own GPU as device 0.",
        "--gpu-visibility per-task",
        choices=("all", "per-task"),
    ),
    Option(
        "exp",
        "str",
        "Experiment name: runs go to <run-root>/<exp>/<run-id>/.",
        "--exp sweep1",
        metavar="NAME",
    ),
    Option(
        "run-root",
        "str",
        "Folder that holds the run directories (default ./runs; on Slurm sites "
        "with $SCRATCH: $SCRATCH/<project>; LUMI: /scratch/<account>/$USER/hpclaunch).",
        "--run-root /scratch/p/runs",
        metavar="DIR",
    ),
    Option(
        "share",
        "choice",
        "Who may read the run folders hpclaunch makes: private (0700/0600, the default) or "
        "group (0750/0640, for a team); never others. Default: the profile's.",
        "--share group",
        choices=("private", "group"),
    ),
    Option(
        "env",
        "list",
        "Set a variable for every rank (repeatable); --env NAME takes NAME's value here. "
        "Secret names (a segment KEY, TOKEN, SECRET, PASSWORD, PASS, PAT, ...) never reach "
        "a file: only the job's environment.",
        "--env WANDB_PROJECT=demo",
        metavar="KEY=VALUE",
    ),
    Option(
        "setup",
        "list",
        "A shell line run in the batch script before the launch (repeatable).",
        "--setup 'module load LUMI/24.03'",
        metavar="LINE",
    ),
    Option(
        "sbatch-arg",
        "list",
        "An sbatch option hpclaunch does not model, passed on (repeatable).",
        "--sbatch-arg=--qos=high",
        metavar="ARG",
    ),
    Option(
        "container",
        "str",
        "Run every task inside this image: a path (SIF, SquashFS, directory), a name in the "
        "profile's image folders (LUMI: /appl/local/containers/sif-images), or $SIF as set "
        "by a container module.",
        "--container lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif",
        metavar="IMAGE",
    ),
    Option(
        "container-runtime",
        "choice",
        "Container runtime (default: the profile's; LUMI: apptainer, found as singularity).",
        "--container-runtime charliecloud",
        choices=("apptainer", "charliecloud"),
    ),
    Option(
        "bind",
        "list",
        "Bind a host path into the container, SRC[:DST[:ro]] (repeatable). The run "
        "directory, the project and the profile's binds are added for you.",
        "--bind /scratch/project_465000000/data:/data:ro",
        metavar="SRC[:DST[:ro]]",
    ),
    Option(
        "venv",
        "str",
        "Activate this venv in every task (made by `hpclaunch env create` for the same image).",
        "--venv /project/project_465000000/venvs/torch",
        metavar="PATH",
    ),
    Option(
        "stage",
        "list",
        "Put data on every node before the ranks start (repeatable): a folder (packed once "
        "into a cached tar), a file, an archive (.tar, .tar.gz, .tar.zst) or a SquashFS "
        "image. Ranks find it at $HPCLAUNCH_DATA_<NAME> (NAME: SRC's base name, upper-cased) "
        "in the node-local $HPCLAUNCH_LOCAL, removed when the job ends.",
        "--stage ./imagenet-subset:DATA",
        metavar="SRC[:NAME]",
    ),
    Option(
        "stage-out",
        "list",
        "Copy SRC (relative to $HPCLAUNCH_LOCAL) to DEST when the job ends, also after a "
        "failure or the time limit; DEST/<node>/ per node on more than one node.",
        "--stage-out out:results",
        metavar="SRC:DEST",
    ),
    Option(
        "no-snapshot",
        "flag",
        "Do not copy the project's code into the run directory (on clusters the job "
        "otherwise runs from that snapshot, so later edits never change it).",
        "--no-snapshot",
    ),
    Option(
        "snapshot-limit",
        "mem",
        "Largest code snapshot, a Slurm size: 64K, 500M, 2G (a plain number is MB; 0: no "
        "limit; default 200M). A bigger one is refused, naming the largest files.",
        "--snapshot-limit 500M",
        metavar="SIZE",
    ),
    Option(
        "nccl-debug",
        "flag",
        "Add the profile's NCCL/RCCL debug variables "
        "(LUMI: NCCL_DEBUG=INFO, per-rank NCCL_DEBUG_FILE on node-local /tmp).",
        "--nccl-debug",
    ),
    Option(
        "profile-ranks",
        "str",
        "Run these ranks (comma-separated) under --profiler, inside the container where "
        "they run; output in <run>/profiles/rank-R.* (docs/profiling.md).",
        "--profile-ranks 0,14",
        metavar="R,R,...",
    ),
    Option(
        "profiler",
        "choice",
        "The profiler of --profile-ranks: py-spy (speedscope JSON; shipped with the run), "
        "nsys, rocprof (--stats), or torch (the program's own torch.profiler, told by "
        "HPCLAUNCH_PROFILE=1 and HPCLAUNCH_PROFILE_DIR).",
        "--profiler py-spy",
        choices=("py-spy", "nsys", "rocprof", "torch"),
    ),
    Option(
        "no-watch",
        "flag",
        "Do not sample the GPUs. A job that asks for GPUs runs a GPU watch on each node "
        "beside the ranks (nvidia-smi, rocm-smi or amd-smi): metrics/gpu-<node>.csv, "
        "`hpclaunch top` and `plot`, and a warning when GPUs sit idle waiting for data.",
        "--no-watch",
    ),
    Option(
        "watch-interval",
        "float",
        "Seconds between two GPU samples (default 2; 0.5 to 600).",
        "--watch-interval 5",
        metavar="SECONDS",
    ),
    Option(
        "requeue",
        "flag",
        "Outlive the time limit: shortly before it, pass --requeue-signal to the ranks "
        "(save a checkpoint in $HPCLAUNCH_CHECKPOINT_DIR), wait for them, and queue the "
        "job again; the next attempt sees HPCLAUNCH_RESUME=1 (docs/resumable.md).",
        "--requeue",
    ),
    Option(
        "max-requeues",
        "int",
        "With --requeue: how many times the job may be queued again, Slurm's own "
        "requeues (node failure, preemption) included (default 3: up to 4 attempts).",
        "--max-requeues 10",
        metavar="N",
    ),
    Option(
        "requeue-signal",
        "choice",
        "With --requeue: the signal the ranks get before the time limit (default USR2; "
        "NCCL takes USR1 for itself).",
        "--requeue-signal USR1",
        choices=("USR2", "USR1"),
    ),
    Option(
        "signal-before",
        "int",
        "With --requeue: seconds before the time limit at which the signal is sent "
        "(default 120; Slurm may send it up to a minute earlier). The ranks get this "
        "minus 15 s to exit.",
        "--signal-before 300",
        metavar="SECONDS",
    ),
    Option(
        "after",
        "list",
        "Start only after RUN ended: RUN[:ok] (completed), RUN:any, RUN:notok (repeatable). "
        "RUN: a run id, job id, last, or a sweep (all its points). A dependency that can "
        "never be met is refused, or ends the job instead of leaving it pending.",
        "--after last:ok",
        metavar="RUN[:COND]",
    ),
    Option(
        "chain",
        "int",
        "Submit K jobs of this run, each after the previous one ended, sharing one "
        "checkpoint folder (past the time limit where requeue is not allowed); the chain "
        "stops early once the program writes $HPCLAUNCH_DONE_FILE.",
        "--chain 3",
        metavar="K",
    ),
)

BY_NAME = {opt.name: opt for opt in OPTIONS}
