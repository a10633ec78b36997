"""The code that runs on the compute nodes (or inside images), not in hpclaunch.

These files are shipped out of this package:

- ``bootstrap.py``: in front of the user's program in every task of a job. Runs with the
  image's or the node's ``python3``: Python >= 3.8.
- ``stage_guard.py``: the per-node staging guard (unpack, wait, ``--stage-out``, clean
  up). Runs with the nodes' own ``python3``, 3.6 on some sites (SLES on LUMI).
- ``venv_probe.py``: `hpclaunch env create`'s part inside the image (Python >= 3.8).
- ``gpu_watch.py``: one per node beside the ranks, sampling the node's GPU tool
  (nvidia-smi, rocm-smi, amd-smi) outside any container: the nodes' ``python3``, >= 3.6.
- ``wandb_agent.py``: a W&B sweep point's agent side, where the job runs (after the
  --setup lines, inside the container): runs `wandb agent` with an `hpclaunch` of its own
  on PATH that hands the sweep's command to the batch shell (Python >= 3.6).
- ``doctor_probe.py``: `hpclaunch doctor`'s probe, copied beside the doctor's runs; once
  per node (the nodes' ``python3``) and as every rank's program (the image's).
- ``callrank.py``: `hpclaunch.call`'s rank (Python >= 3.8), run from the run folder's
  ``call/``: the standard library plus the caller's cloudpickle shipped beside it.
- ``pack_agent.py``: a packed sweep's node agent (`sweep --pack`), one srun task per node
  running that node's slots from the sweep's queue (the nodes' ``python3``, >= 3.8).
- ``venv_mount.py``: a packed venv (`hpclaunch env pack`) mounted with squashfuse at its
  original path, once per node beside the ranks, when no Apptainer mounts it (>= 3.6).
- ``stage_bcast.py``: staged files, a packed venv and a --container image file sent once
  to every node with sbcast, by the batch script before the guards start; ``--drop``
  removes a node's copies after the ranks (>= 3.6).
- ``relay.py``: `hpclaunch dev`'s relay, its text handed to the node's ``python3 -I -S
  -c`` in an overlapping step: TCP to a loopback port carried over the step's stdio
  (Python >= 3.8); the host imports its frame codec.
- ``dev_sshd.py``: `hpclaunch dev --vscode`'s sshd on the node: the step's environment
  saved before sshd starts, put back by its ForceCommand (Python >= 3.8; copied into the
  run folder's dev-ssh/).
- ``stack_probe.py``: `hpclaunch stack`'s probe, its text handed to each node's
  ``python3 -I -S -c`` in an overlapping step: py-spy on the node's ranks (>= 3.6).
- ``preflight.py``: --preflight's node checks (one task a node), and on the batch host
  the verdict, the ranks' placement around bad nodes (--spares) and a node fault's
  finding (the nodes' ``python3``, >= 3.6).

Rules for those files, checked by tests/test_node_package.py:

- standard library only, and never an import of hpclaunch: they run where hpclaunch is
  not installed;
- each stays within its Python version: no ``from __future__ import annotations``, no
  walrus, no builtin generics in the stage guard (3.6); nothing newer than 3.8 in the
  other two;
- each file runs alone: bootstrap and stage guard are copied into the run directory and
  run with ``python3 -I -S``, which does not put the script's folder on sys.path; the
  venv probe's text is handed to the image's ``python3 -I -c`` (with site: it lists the
  image's packages). None can import another, so each keeps its own copy of the
  constants it shares.

This module is the host side's single definition of those shared constants (file names,
environment variables, flags, the MASTER_PORT formula); the host modules import them from
here and the test checks that every shipped copy is equal. The run directory keeps the
names it always had (``bootstrap.py``, ``stage_node.py``): batch scripts name them.
"""

from __future__ import annotations

from pathlib import Path

# --- the shipped files: name here -> name in a run directory
BOOTSTRAP = "bootstrap.py"
LOADER = "bootstrap_loader.py"  # runs the bootstrap from cached bytecode
STAGE_GUARD = "stage_guard.py"
GPU_WATCH = "gpu_watch.py"  # the per-node GPU watch (the nodes' python3, >= 3.6)
VENV_PROBE = "venv_probe.py"  # never copied: its text is handed to the image's Python
STACK_PROBE = "stack_probe.py"  # never copied: its text is handed to the nodes' python3
DEV_SSHD = "dev_sshd.py"  # hpclaunch dev --vscode: the sshd's saved environment (copied)
RELAY = "relay.py"  # hpclaunch dev's relay: never copied, its text to the nodes' python3
WANDB_AGENT = "wandb_agent.py"  # a W&B sweep's agent side, in the sweep folder
PACK_AGENT = "pack_agent.py"  # a packed sweep's node agent (sweep --pack), in the sweep folder
VENV_MOUNT = "venv_mount.py"  # squashfuse of a packed venv, one per node (the nodes' python3)
STAGE_BCAST = "stage_bcast.py"  # sbcast of staged files and a packed venv (the nodes' python3)
PREFLIGHT = "preflight.py"  # nodes' checks, placement, faults; a past attempt's lost nodes
# The batch script runs <run_dir>/bootstrap.py: the loader, which imports the bootstrap
# under the module name below (so its bytecode is cached in <run_dir>/__pycache__).
BOOTSTRAP_MODULE = "hpclaunch_bootstrap"
RUN_DIR_NAME = {
    LOADER: "bootstrap.py",
    BOOTSTRAP: BOOTSTRAP_MODULE + ".py",
    STAGE_GUARD: "stage_node.py",
    GPU_WATCH: "gpu_watch.py",
    WANDB_AGENT: "wandb_agent.py",
    VENV_MOUNT: "venv_mount.py",
    STAGE_BCAST: "stage_bcast.py",
    PREFLIGHT: "preflight.py",
}
# How they are started: isolated, no site (they need only the standard library).
PYTHON_FLAGS = ("-I", "-S")

# --- the run directory
STAGE_JSON = "stage.json"  # what the stage guard does, written by the host
EVENTS = "events.jsonl"  # one JSON object per line, appended by bootstrap and guard
RANK_START, RANK_END = "rank_start", "rank_end"  # bootstrap events
STAGE_READY, STAGE_DONE = "stage_ready", "stage_done"  # stage guard events
LOGS = "logs"
RANKS_TSV = "ranks.tsv"  # in logs/: rank<TAB>node<TAB>local_rank<TAB>pid, one line a rank
RANK_FILE = "rank-%d.%s"  # in logs/: rank-R.out, rank-R.err, rank-R.exit
OUT, ERR, EXIT = "out", "err", "exit"
# Above the profile's node_logs_above ranks (script/render.py): one file a node, lines
# tagged "[node rank] " (observe/nodelogs.py reads them), and one file of exit records.
HPCLAUNCH_NODE_LOGS = "HPCLAUNCH_NODE_LOGS"  # "1": node files, not rank files
NODE_FILE = "node-%s.log"  # in logs/: the node's name, "/" as "_" (a local run's label)
EXITS = "exits.jsonl"  # in logs/: one rank-R.exit record a line
STAGE_MARKS = "stage"  # folder of the guards' markers: ready-<node>, failed-<node>
READY, FAILED = "ready-", "failed-"
VENV_MARKS = "venvmount"  # folder of the packed venv mounts' markers (venv_mount.py)

# --- the GPU watch: <run>/metrics/gpu-<node>.csv, its input-bound verdict as an event
METRICS = "metrics"
GPU_CSV = "gpu-%s.csv"
INPUT_BOUND = "input_bound"
NODE_BAD = "node_bad"  # preflight.py: {"node", "why", "attempt"}, a node not to use again

# --- staging: the kinds of --stage items (stage.json's "kind"), a directory's pack
DIRECTORY, ARCHIVE, SQUASHFS, FILE = "directory", "archive", "squashfs", "file"
# A directory's pack is a folder of these: part 00 the folders, 01.. the files. The guard
# unpacks them in name order, so part 00 must sort first.
PACK_PART = "part-%02d.tar"
# ... and its symlinks, checked to point inside the tree and made last, after every part.
LINKS_PART = "links.tar"
# Node-local folders are <parent>/hpclaunch-<jobid>[-a<N>].<random> (mkdtemp, mode 700),
# made by the job's first step on each node (the stage guard, else the bootstrap of local
# rank 0), which records the path in <run>/nodelocal/<node>.<jobid>[-a<N>] for the ranks;
# until the bootstrap reads it, $HPCLAUNCH_LOCAL holds LOCAL_UNSET, which the bootstrap
# replaces in every variable (HPCLAUNCH_DATA_*, MIOPEN_*, NCCL_DEBUG_FILE) by the folder.
LOCAL_PREFIX = "hpclaunch-"
LOCAL_RECORDS = "nodelocal"  # in the run directory
LOCAL_UNSET = "/@hpclaunch-local@"

# --- MASTER_PORT from a job id J: PORT_BASE + J % PORT_SPAN (below Linux's ephemeral
# ports, 32768+): jobs whose ids differ by less than PORT_SPAN never share it.
PORT_BASE, PORT_SPAN = 20000, 12000

# --- bootstrap options (never a program's first word): read the task's environment from
# a file descriptor (containers), and only exec what follows (in front of torchrun).
ENV_FD_FLAG = "--hpclaunch-env-fd="
EXEC_FLAG = "--hpclaunch-exec"

# --- environment variables the host sets and the shipped files read (name = value)
HPCLAUNCH_RUN_DIR = "HPCLAUNCH_RUN_DIR"
HPCLAUNCH_RESULT_FILE = "HPCLAUNCH_RESULT_FILE"  # rank 0's result for Run.result()
RESULT_JSON = "result.json"  # in the run directory
HPCLAUNCH_LOG_DIR = "HPCLAUNCH_LOG_DIR"
HPCLAUNCH_ARGV = "HPCLAUNCH_ARGV"  # a program line holding ":", hex-encoded
HPCLAUNCH_FORWARD_SIGNALS = "HPCLAUNCH_FORWARD_SIGNALS"
HPCLAUNCH_GPU_VISIBILITY = "HPCLAUNCH_GPU_VISIBILITY"
HPCLAUNCH_GPU_VARS = "HPCLAUNCH_GPU_VARS"
HPCLAUNCH_GPU_UNSET = "HPCLAUNCH_GPU_UNSET"
# Appended to the first node's name for MASTER_ADDR (a site's rendezvous_suffix: JSC's "i")
HPCLAUNCH_MASTER_SUFFIX = "HPCLAUNCH_MASTER_SUFFIX"
HPCLAUNCH_CACHE_DIRS = "HPCLAUNCH_CACHE_DIRS"
HPCLAUNCH_VENV = "HPCLAUNCH_VENV"
HPCLAUNCH_CONTAINER_PASS = "HPCLAUNCH_CONTAINER_PASS"
HPCLAUNCH_LOCAL = "HPCLAUNCH_LOCAL"
HPCLAUNCH_LOCAL_PARENT = "HPCLAUNCH_LOCAL_PARENT"  # where the node-local folder is made
HPCLAUNCH_LOCAL_RECORD = "HPCLAUNCH_LOCAL_RECORD"  # <run>/nodelocal: its path, per node
HPCLAUNCH_NODE_LABEL = "HPCLAUNCH_NODE_LABEL"  # a local -N 2 rank's simulated node: host/node1
HPCLAUNCH_PARAM_NAMES = "HPCLAUNCH_PARAM_NAMES"  # a sweep point's parameter names, comma-joined
# bootstrap.PLACEHOLDERS' keys, the per-rank placeholders a sweep's names may not take
# (tests/test_sweep_points.py keeps the two equal)
RANK_PLACEHOLDERS = (
    "rank", "local_rank", "world_size", "local_world_size", "node_rank", "master_addr",
    "master_port",
)  # fmt: skip
PARAM_PREFIX = "HPCLAUNCH_PARAM_"  # + NAME upper-cased: that parameter's value as text
HPCLAUNCH_POINT_ARGS = "HPCLAUNCH_POINT_ARGS"  # a sweep point's extra arguments, hex, comma-joined
HPCLAUNCH_POINT_PROGRAM = "HPCLAUNCH_POINT_PROGRAM"  # a W&B point's whole program line, hex
HPCLAUNCH_ATTEMPT = "HPCLAUNCH_ATTEMPT"  # --requeue: 0, 1, ... (rank events carry it)
HPCLAUNCH_REQUEUE_SIGNAL = "HPCLAUNCH_REQUEUE_SIGNAL"  # --requeue: USR1 or USR2
HPCLAUNCH_STAGE_MARKS = "HPCLAUNCH_STAGE_MARKS"  # --requeue: the attempt's stage/ folder
HPCLAUNCH_STAGE_BCAST = "HPCLAUNCH_STAGE_BCAST"  # the map of sbcast's node-local copies
BROADCAST_MAP = "broadcast.json"  # in the run directory: {shared path: node-local copy}

# --- a W&B point: what wandb_agent.py hands the batch shell (sweeps/wandb.py reads it)
HANDOFF = "wandb-run.json"  # the sweep's command, the agent's WANDB_*, the parameters
WANDB_EXIT = "wandb-exit"  # the point's job.sh exit code, which the agent's run ends with
HPCLAUNCH_WANDB_POINT = "HPCLAUNCH_WANDB_POINT"  # the point's folder
# "1": a packed point's agent runs the sweep's command itself (no batch shell to hand to)
HPCLAUNCH_WANDB_DIRECT = "HPCLAUNCH_WANDB_DIRECT"

# --- what venv_probe.py writes into a venv, and the request for the image's packages only
VENV_RECORD = "hpclaunch-venv.json"
VENV_CONSTRAINTS = "hpclaunch-constraints.txt"
LIST_ONLY = "list_only"


def shipped(
    staging: bool,
    watching: bool,
    venv_mount: bool = False,
    broadcast: bool = False,
    placing: bool = False,
) -> list[str]:
    """The shipped files a run folder gets: always the bootstrap, and the stage guard,
    the GPU watch, the packed venv's mount, the broadcast and the preflight (--preflight,
    --spares) when the job runs them."""
    files = [LOADER, BOOTSTRAP] + [STAGE_GUARD] * staging + [GPU_WATCH] * watching
    return files + [VENV_MOUNT] * venv_mount + [STAGE_BCAST] * broadcast + [PREFLIGHT] * placing


def path(name: str) -> Path:
    """A shipped file of this package (BOOTSTRAP, STAGE_GUARD, VENV_PROBE, ...), on disk."""
    return Path(__file__).with_name(name)


# --- profiling chosen ranks (--profile-ranks/--profiler) and --nccl-debug's files
# (hpclaunch/script/profiling.py on the host, the bootstrap in the job; docs/profiling.md)
PROFILES = "profiles"  # <run>/profiles/: rank-R.* written by the profilers
PYSPY = "py-spy"  # the static py-spy binary, copied beside the bootstrap (containers see it)
HPCLAUNCH_PROFILER = "HPCLAUNCH_PROFILER"  # py-spy | nsys | rocprof | torch
HPCLAUNCH_PROFILE_RANKS = "HPCLAUNCH_PROFILE_RANKS"  # the chosen ranks, comma-joined
HPCLAUNCH_PROFILE_DIR = "HPCLAUNCH_PROFILE_DIR"  # <run>/profiles
HPCLAUNCH_PROFILE = "HPCLAUNCH_PROFILE"  # set by the bootstrap: "1" on a chosen rank, else "0"
HPCLAUNCH_PYSPY = "HPCLAUNCH_PYSPY"  # the py-spy the ranks run
# The bootstrap run again between the profiler and the program, only to learn the
# program's exit status (no profiler passes it on): SIGNALS:STATUS_FILE follows the flag.
CHILD_FLAG = "--hpclaunch-child="
HPCLAUNCH_NCCL_COLLECT = "HPCLAUNCH_NCCL_COLLECT"  # "1": copy NCCL_DEBUG_FILE into logs/nccl/
NCCL_DIR = "nccl"  # in the attempt's log folder
NCCL_FILE = "rank-%d.txt"  # in logs/nccl/
