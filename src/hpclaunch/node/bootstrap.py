"""hpclaunch bootstrap: runs in front of the user's program in every task of a job.

Invoked as ``python3 -I -S <run_dir>/bootstrap.py PROGRAM [ARGS...]`` (the contract is
docs/internals.md, "The bootstrap"). It is a copy in the run directory and runs inside
users' containers with whatever Python they ship, so: standard library only, Python >= 3.8,
and it never imports the hpclaunch package (the rules: hpclaunch/node/__init__.py, which
also holds the host's definition of the constants below marked "shared").

It must stay one file (it is copied alone into the run directory and run with ``-I``,
which puts no folder of it on sys.path), hence its length. It runs once per rank, so
start-up time matters. Modules that pull in ``enum``, ``re`` or
``typing`` (signal, json, subprocess, typing itself) would cost 3-20 ms each and are
avoided on purpose: the C module ``_signal``, hand-written parsing and JSON, and
``posix_spawnp`` instead of subprocess. Even ``os`` (~2 ms: stat, posixpath,
_collections_abc, ...) is left out: the C module ``posix``, which every Python has loaded
before it runs a line, offers all the calls, and the few helpers ``os`` would add are
written out below (``_makedirs``, ``_fsencode``, ``_execvpe``, the environment as a dict).
"""

from __future__ import annotations  # annotations stay strings: `typing` is never imported

import posix
import sys
import time

TYPE_CHECKING = False  # mypy treats this name as true; at run time nothing below is imported
if TYPE_CHECKING:
    import signal as _signal
    from types import FrameType
    from typing import Dict, List, MutableMapping, Optional, Tuple

    Env = MutableMapping[str, str]
else:
    try:
        import _signal  # the C half of `signal`, without its enum import
    except ImportError:  # Python implementations without it
        import signal as _signal

PREFIX = "hpclaunch-bootstrap: "

# Shared with the host side (hpclaunch/node/__init__.py has the same values; a test
# compares them): this file runs alone, so it cannot import them.
EVENTS = "events.jsonl"
RANK_START, RANK_END = "rank_start", "rank_end"
RANKS_TSV = "ranks.tsv"
RANK_FILE = "rank-%d.%s"
OUT, ERR, EXIT = "out", "err", "exit"
# Above the profile's node_logs_above ranks: the ranks of a node share one file of lines
# tagged "[node rank] ", and every rank's exit record is one line of one file.
HPCLAUNCH_NODE_LOGS = "HPCLAUNCH_NODE_LOGS"  # "1": node files, not rank files
NODE_FILE = "node-%s.log"  # in logs/: the node's name, "/" as "_" (a local run's label)
EXITS = "exits.jsonl"  # in logs/: one rank-R.exit record a line
PORT_BASE, PORT_SPAN = 20000, 12000
ENV_FD_FLAG = "--hpclaunch-env-fd="
EXEC_FLAG = "--hpclaunch-exec"
HPCLAUNCH_RUN_DIR = "HPCLAUNCH_RUN_DIR"
HPCLAUNCH_RESULT_FILE = "HPCLAUNCH_RESULT_FILE"
RESULT_JSON = "result.json"
HPCLAUNCH_LOG_DIR = "HPCLAUNCH_LOG_DIR"
HPCLAUNCH_ARGV = "HPCLAUNCH_ARGV"
HPCLAUNCH_FORWARD_SIGNALS = "HPCLAUNCH_FORWARD_SIGNALS"
HPCLAUNCH_GPU_VISIBILITY = "HPCLAUNCH_GPU_VISIBILITY"
HPCLAUNCH_GPU_VARS = "HPCLAUNCH_GPU_VARS"
HPCLAUNCH_GPU_UNSET = "HPCLAUNCH_GPU_UNSET"
HPCLAUNCH_MASTER_SUFFIX = "HPCLAUNCH_MASTER_SUFFIX"
HPCLAUNCH_CACHE_DIRS = "HPCLAUNCH_CACHE_DIRS"
HPCLAUNCH_VENV = "HPCLAUNCH_VENV"
HPCLAUNCH_CONTAINER_PASS = "HPCLAUNCH_CONTAINER_PASS"
HPCLAUNCH_PARAM_NAMES = "HPCLAUNCH_PARAM_NAMES"  # a sweep point's parameter names, comma-joined
PARAM_PREFIX = "HPCLAUNCH_PARAM_"  # + NAME upper-cased: that parameter's value as text
HPCLAUNCH_POINT_ARGS = "HPCLAUNCH_POINT_ARGS"  # a sweep point's extra arguments, hex, comma-joined
HPCLAUNCH_POINT_PROGRAM = "HPCLAUNCH_POINT_PROGRAM"  # a W&B point's whole program line, hex
HPCLAUNCH_ATTEMPT = "HPCLAUNCH_ATTEMPT"  # --requeue: 0, 1, ... (rank events carry it)
HPCLAUNCH_REQUEUE_SIGNAL = "HPCLAUNCH_REQUEUE_SIGNAL"  # --requeue: USR1 or USR2
# --profile-ranks/--profiler and --nccl-debug (docs/profiling.md)
HPCLAUNCH_PROFILER = "HPCLAUNCH_PROFILER"  # py-spy | nsys | rocprof | torch
HPCLAUNCH_PROFILE_RANKS = "HPCLAUNCH_PROFILE_RANKS"  # the chosen ranks, comma-joined
HPCLAUNCH_PROFILE_DIR = "HPCLAUNCH_PROFILE_DIR"  # <run>/profiles
HPCLAUNCH_PROFILE = "HPCLAUNCH_PROFILE"  # set here: "1" on a chosen rank, else "0"
HPCLAUNCH_PYSPY = "HPCLAUNCH_PYSPY"  # the py-spy the ranks run
LOADED_AS = "hpclaunch_bootstrap.py"  # this file's name in a run folder, beside its loader
CHILD_FLAG = "--hpclaunch-child="  # SIGNALS:STATUS_FILE: this file between profiler and program
HPCLAUNCH_NCCL_COLLECT = "HPCLAUNCH_NCCL_COLLECT"  # "1": copy NCCL_DEBUG_FILE into logs/nccl/
NCCL_DIR = "nccl"
NCCL_FILE = "rank-%d.txt"
# The node-local folder (hpclaunch/node/__init__.py says how it is made and found).
HPCLAUNCH_LOCAL = "HPCLAUNCH_LOCAL"
HPCLAUNCH_LOCAL_PARENT = "HPCLAUNCH_LOCAL_PARENT"
HPCLAUNCH_LOCAL_RECORD = "HPCLAUNCH_LOCAL_RECORD"
HPCLAUNCH_NODE_LABEL = "HPCLAUNCH_NODE_LABEL"  # a local -N 2 rank's simulated node: host/node1
LOCAL_PREFIX = "hpclaunch-"
LOCAL_UNSET = "/@hpclaunch-local@"
LOCAL_LOCK = ".ranks"  # in the folder: every rank holds a shared flock on it while it runs
LOCAL_WAIT_S = 300.0  # how long a rank waits for local rank 0 to make the folder

# Placeholder name -> the variable that holds its value.
PLACEHOLDERS = {
    "rank": "RANK",
    "local_rank": "LOCAL_RANK",
    "world_size": "WORLD_SIZE",
    "local_world_size": "LOCAL_WORLD_SIZE",
    "node_rank": "NODE_RANK",
    "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT",
}

# Slurm's per-task view of the step. Under torchrun there is one Slurm task per node but
# several workers, so these describe the agent, not the worker; libraries that detect
# Slurm first (Lightning's SLURMEnvironment looks for SLURM_NTASKS) would then take the
# wrong ranks. Job-wide SLURM_* (job id, node list, node id, cpus) stay.
SLURM_PER_TASK = {
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASK_PID", "SLURM_GTIDS",
}  # fmt: skip
SLURM_PER_TASK_PREFIXES = ("SLURM_CPU_BIND",)  # SLURM_CPU_BIND, _TYPE, _LIST, _VERBOSE

HANDLED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")

# os.fsencode / os.fsdecode, and os.environ's own codec (always surrogateescape).
FS_ENCODING, FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
DEFAULT_EXEC_PATH = "/bin:/usr/bin"  # os.defpath: os.execvp's search path without PATH


def first_host(nodelist: str) -> str:
    """First host of a compressed Slurm node list: ``nid[005000-005003,7]`` -> ``nid005000``.

    Only the first host is needed (for MASTER_ADDR), so no full expansion: take the text up
    to the first comma outside brackets, and from every bracket group its first number
    exactly as written (zero padding included).
    """
    out = []
    i = 0
    n = len(nodelist)
    while i < n:
        ch = nodelist[i]
        if ch == ",":
            break
        if ch == "[":
            end = nodelist.find("]", i)
            if end < 0:  # malformed: keep the rest as it is rather than fail
                out.append(nodelist[i:])
                break
            out.append(nodelist[i + 1 : end].split(",", 1)[0].split("-", 1)[0].strip())
            i = end + 1
            continue
        out.append(ch)
        i += 1
    return "".join(out).strip()


def tasks_on_node(spec: str, node_index: int) -> Optional[int]:
    """Tasks on node ``node_index`` from Slurm's ``2(x3),1`` syntax; None if unparsable."""
    first = 0
    for item in spec.split(","):
        count, sep, repeat = item.strip().partition("(x")
        try:
            tasks = int(count)
            times = int(repeat.rstrip(")")) if sep else 1
        except ValueError:
            return None
        if node_index < first + times:
            return tasks
        first += times
    return None


def expand(arg: str, values: Dict[str, str], any_escape: bool = False) -> str:
    """Replace ``{name}`` by its value and ``{{name}}`` by ``{name}`` for known names.

    Every other character is kept, including other brace text (JSON, ``{x}``, ``{{x}}``)
    and surrogate-escaped bytes. Scans left to right; at each ``{`` the escaped form
    ``{{name}}`` is tried before ``{name}``. In a sweep (``any_escape``) every
    ``{{identifier}}`` is a literal ``{identifier}``: there an unknown ``{x}`` was refused
    at submission with the fix "write {{x}}".
    """
    if "{" not in arg:
        return arg
    out = []
    i = 0
    while True:
        start = arg.find("{", i)
        close = arg.find("}", start) if start >= 0 else -1
        if close < 0:
            out.append(arg[i:])
            return "".join(out)
        out.append(arg[i:start])
        if arg.startswith("{{", start) and arg.startswith("}}", close):
            name = arg[start + 2 : close]
            if name in values or (any_escape and _identifier(name)):
                out.append("{" + name + "}")
                i = close + 2
                continue
        name = arg[start + 1 : close]
        if name in values:
            out.append(values[name])
            i = close + 1
        else:
            out.append("{")
            i = start + 1


def _identifier(name: str) -> bool:
    return name.isidentifier() and name.isascii()


def _int(value: Optional[str], default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def set_rank_env(env: Env) -> None:
    """Fill RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK and MASTER_*."""
    if "TORCHELASTIC_RUN_ID" in env:
        # A torchrun worker: torchrun's own ranks are the truth.
        for name in list(env):
            if name in SLURM_PER_TASK or name.startswith(SLURM_PER_TASK_PREFIXES):
                del env[name]
        for name, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
            env.setdefault(name, default)
        env.setdefault("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])
        env["NODE_RANK"] = env.get("GROUP_RANK", env.get("NODE_RANK", "0"))
    elif "SLURM_PROCID" in env:
        # A task of srun (or of the local backend, which sets what a real step would).
        world = _int(
            env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", env.get("SLURM_STEP_NUM_TASKS"))), 1
        )
        node = _int(env.get("SLURM_NODEID"), 0)
        local_world = None
        for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            if local_world is None and env.get(name):
                local_world = tasks_on_node(env[name], node)
        if local_world is None:  # no usable layout: assume an even spread
            nodes = _int(env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_JOB_NUM_NODES")), 1)
            local_world = max(1, world // max(1, nodes))
        env["RANK"] = str(_int(env["SLURM_PROCID"], 0))
        env["WORLD_SIZE"] = str(world)
        env["LOCAL_RANK"] = str(_int(env.get("SLURM_LOCALID"), 0))
        env["LOCAL_WORLD_SIZE"] = str(local_world)
        env["NODE_RANK"] = str(node)
    else:
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", NODE_RANK="0")
    if not env.get("MASTER_ADDR"):
        nodelist = ""
        for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            nodelist = nodelist or env.get(name, "")
        host = first_host(nodelist)
        # A site whose nodes reach each other by another name (JSC: <node>i, InfiniBand).
        env["MASTER_ADDR"] = host + env.get(HPCLAUNCH_MASTER_SUFFIX, "") if host else "127.0.0.1"
    if not env.get("MASTER_PORT"):
        # Same formula as the batch script: jobs whose ids differ by < PORT_SPAN never
        # collide. Without a job id, torch's own default.
        job = _int(env.get("SLURM_JOB_ID"), -1)
        env["MASTER_PORT"] = str(PORT_BASE + job % PORT_SPAN if job >= 0 else 29500)


def set_gpu_visibility(env: Env) -> None:
    """Under ``per-task``, give each task one device of what the node offers."""
    if env.get(HPCLAUNCH_GPU_VISIBILITY) != "per-task":
        return
    local_rank = _int(env.get("LOCAL_RANK"), 0)
    for name in env.get(HPCLAUNCH_GPU_VARS, "").split(","):
        name = name.strip()
        if not name:
            continue
        # Slurm may already list the node's devices (CUDA_VISIBLE_DEVICES=4,5): then the
        # task's device is the LOCAL_RANK-th of them, not device number LOCAL_RANK. A single
        # value is a list of one (e.g. Slurm bound one GPU per task), kept as it is.
        devices = [d.strip() for d in env.get(name, "").split(",") if d.strip()]
        env[name] = devices[local_rank % len(devices)] if devices else str(local_rank)
    for name in env.get(HPCLAUNCH_GPU_UNSET, "").split(","):
        env.pop(name.strip(), None)


def _fsencode(text: str) -> bytes:
    return text.encode(FS_ENCODING, FS_ERRORS)


def _fsdecode(data: bytes) -> str:
    return data.decode(FS_ENCODING, FS_ERRORS)


def _join(head: str, tail: str) -> str:
    """os.path.join for a relative ``tail``."""
    return head + tail if head.endswith("/") or not head else head + "/" + tail


def _isdir(path: str) -> bool:
    try:
        return posix.stat(path).st_mode & 0o170000 == 0o040000  # stat.S_ISDIR
    except (OSError, ValueError):
        return False


def _makedirs(path: str) -> None:
    """os.makedirs(path, exist_ok=True): ranks may race here, so a folder that is there
    (made by whoever) is fine; anything else in the way raises mkdir's own error."""
    try:
        posix.mkdir(path, 0o777)
        return
    except FileNotFoundError:  # a parent is missing: make it (os.makedirs' recursion)
        name = path.rstrip("/")
        head = name[: name.rfind("/") + 1]
        head = head.rstrip("/") or head
        if not head or head == path:
            raise
        try:  # noqa: SIM105 - contextlib would be one more import
            _makedirs(head)
        except FileExistsError:
            pass  # as os.makedirs: the mkdir below says what is wrong
    except OSError:
        if not _isdir(path):
            raise
        return
    try:
        posix.mkdir(path, 0o777)
    except OSError:
        if not _isdir(path):
            raise


def _environ() -> Dict[str, str]:
    """What os.environ holds, as a plain dict. The bootstrap changes it and hands it
    explicitly to the program it starts (posix_spawnp, execve), which then sees exactly
    what os.environ's putenv calls would have left in this process's environment."""
    return {
        key.decode(FS_ENCODING, "surrogateescape"): value.decode(FS_ENCODING, "surrogateescape")
        for key, value in posix.environ.items()
    }


def _export_path(env: Env) -> None:
    """posix_spawnp searches the PATH of this process, not the one it passes on: put the
    bootstrap's PATH (venv, container default) there, as os.environ's putenv did."""
    path = env.get("PATH")
    if path is None:
        posix.unsetenv("PATH")
    else:
        posix.putenv("PATH", path)


def _execvpe(file: str, args: List[str], env: Env) -> None:
    """os.execvp(file, args) after os.environ was given ``env``: the same PATH search,
    the same errors (the first that is not "not there" wins), the same environment."""
    if "/" in file:
        candidates = [file]
    else:
        candidates = [_join(d, file) for d in env.get("PATH", DEFAULT_EXEC_PATH).split(":")]
    first: Optional[OSError] = None
    last: Optional[OSError] = None
    for candidate in candidates:
        try:
            posix.execve(_fsencode(candidate), args, env)
        except OSError as exc:
            # Without the file name in the text: os.execv's errors have none.
            last = OSError(exc.errno, exc.strerror)
            if first is None and not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
                first = last
    raise first or last or OSError("no path to search")


def _say(line: str, fds: Tuple[int, ...] = (2,)) -> None:
    data = _fsencode(PREFIX + line.replace("\n", " ") + "\n")
    for fd in fds:
        try:
            posix.write(fd, data)
        except OSError:
            continue  # a closed stderr must not stop the run


def make_cache_dirs(spec: str) -> None:
    for path in spec.split(":"):
        if path:
            try:
                _makedirs(path)  # exist_ok: 8 ranks may race here
            except OSError as exc:
                _say("cannot create cache directory %s: %s" % (path, exc.strerror))


# ---- the node-local folder: made by the job's first step on each node, found here


def _read_record(path: str) -> str:
    """The folder a node's record names, or "" while there is none."""
    try:
        fd = posix.open(path, posix.O_RDONLY | posix.O_NOFOLLOW)
    except OSError:
        return ""
    try:
        return _fsdecode(posix.read(fd, 1 << 16))
    finally:
        posix.close(fd)


def _write_private(path: str, data: bytes) -> None:
    """``data`` in a new 0600 file (never through a link), renamed into place whole."""
    tmp = "%s.tmp.%d" % (path, posix.getpid())
    flags = posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW
    fd = posix.open(tmp, flags, 0o600)
    try:
        _write_all(fd, data)
    finally:
        posix.close(fd)
    posix.replace(tmp, path)


def _make_local(parent: str, tag: str) -> str:
    """tempfile.mkdtemp without its imports: mode 700, a name nobody can guess; mkdir
    never follows a symlink and fails on anything planted, so nothing is used as found."""
    if not _isdir(parent):
        parent = "/tmp"  # a $TMPDIR of the submitting machine: as the stage guard does
    for _ in range(100):
        path = _join(parent, "%s%s.%s" % (LOCAL_PREFIX, tag, posix.urandom(8).hex()))
        try:
            posix.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise FileExistsError("no free name in %s" % parent)


def node_local(env: Env, node: str) -> Tuple[str, int, bool]:
    """Find (or, as local rank 0 of a job that stages nothing, make) the job's folder on
    this node; put it in place of LOCAL_UNSET in every variable. Returns (the folder,
    the fd of the shared lock this rank holds on it or -1, whether this rank made it)."""
    if env.get(HPCLAUNCH_LOCAL) != LOCAL_UNSET:
        return "", -1, False
    job, attempt = env.get("SLURM_JOB_ID") or "0", env.get(HPCLAUNCH_ATTEMPT, "")
    tag = job + ("-a" + attempt if attempt.isdigit() else "")
    record_dir = env.get(HPCLAUNCH_LOCAL_RECORD, "")
    record = _join(record_dir, node + "." + tag)
    local, made = _read_record(record), False
    try:
        if not local and env.get("LOCAL_RANK") == "0":  # no stage guard ran on this node
            local = _make_local(env.get(HPCLAUNCH_LOCAL_PARENT) or "/tmp", tag)
            made = True
            try:  # noqa: SIM105 - contextlib would be one more import (private, in the run folder)
                posix.mkdir(record_dir, 0o700)
            except FileExistsError:
                pass
            _write_private(record, _fsencode(local))
        deadline = time.monotonic() + LOCAL_WAIT_S
        while not local and time.monotonic() < deadline:
            time.sleep(0.01)
            local = _read_record(record)
        if not local:
            raise TimeoutError("no node-local folder recorded in %s" % record)
        flags = posix.O_RDWR | posix.O_CREAT | posix.O_NOFOLLOW
        lock = posix.open(_join(local, LOCAL_LOCK), flags, 0o600)
    except OSError as exc:
        _say("no node-local folder: %s" % exc)
        return "", -1, made
    import fcntl  # a C module: well under a millisecond, and only when there is a folder

    fcntl.flock(lock, fcntl.LOCK_SH)
    for name, value in env.items():
        if LOCAL_UNSET in value:
            env[name] = value.replace(LOCAL_UNSET, local)
    return local, lock, made


def _rmtree(path: str) -> None:
    """shutil.rmtree without the import; never follows a symlink."""
    try:
        entries = list(posix.scandir(path))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            _rmtree(entry.path)
        else:
            _remove(entry.path)
    try:  # noqa: SIM105 - contextlib would be one more import
        posix.rmdir(path)
    except OSError:
        pass


def remove_local(env: Env, local: str, lock: int, node: str) -> None:
    """The maker's end: once every other rank on the node has let go of the lock (they
    let go when they end), the folder and its record go. A rank that never ends is left
    to the time limit; the next staging step or `hpclaunch clean` removes the folder."""
    import fcntl

    deadline = time.monotonic() + LOCAL_WAIT_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
    job, attempt = env.get("SLURM_JOB_ID") or "0", env.get(HPCLAUNCH_ATTEMPT, "")
    tag = job + ("-a" + attempt if attempt.isdigit() else "")
    _remove(_join(env.get(HPCLAUNCH_LOCAL_RECORD, ""), node + "." + tag))
    _rmtree(local)


def node_name(env: Env) -> str:
    return env.get("SLURMD_NODENAME") or posix.uname().nodename.split(".")[0]


def node_label(env: Env, node: str) -> str:
    """The node the logs and events name: a local run's simulated node (`vm/node1`,
    every one of them this host), else the node itself."""
    return env.pop(HPCLAUNCH_NODE_LABEL, "") or node


def _append(path: str, data: bytes) -> None:
    """One write on O_APPEND: the lines of many ranks never interleave."""
    fd = posix.open(path, posix.O_WRONLY | posix.O_CREAT | posix.O_APPEND, 0o666)
    try:
        posix.write(fd, data)
    finally:
        posix.close(fd)


def open_logs(log_dir: str, rank: int, node: str, local_rank: int) -> Tuple[int, int]:
    """Append this rank's line to ranks.tsv and open rank-R.out/.err (append mode)."""
    flags = posix.O_WRONLY | posix.O_CREAT | posix.O_APPEND
    _makedirs(log_dir)
    line = "%d\t%s\t%d\t%d\n" % (rank, node, local_rank, posix.getpid())
    _append(_join(log_dir, RANKS_TSV), _fsencode(line))
    # The file name is formatted before the join: a log folder may hold a "%".
    out = posix.open(_join(log_dir, RANK_FILE % (rank, OUT)), flags, 0o666)
    try:
        return out, posix.open(_join(log_dir, RANK_FILE % (rank, ERR)), flags, 0o666)
    except OSError:
        posix.close(out)
        raise


def node_file(node: str) -> str:
    return NODE_FILE % node.replace("/", "_")


class _Pump:
    """Above node_logs_above ranks, the program's output reaches the node's file through a
    pipe and a forked copy of this process that tags each line "[node rank] " and appends
    whole lines (one write on O_APPEND: never mixed with the other ranks' lines). The
    copy ignores the task's signals and ends when the last writer closes the pipe."""

    pid = 0
    LINE_MAX = 64 << 10  # a line longer than this is written in pieces


def open_node_log(log_dir: str, rank: int, node: str, local_rank: int) -> int:
    """Append this rank's ranks.tsv line, start the pump into node-<node>.log; return the
    pipe's end that the program writes to (stdout and stderr alike)."""
    _makedirs(log_dir)
    line = "%d\t%s\t%d\t%d\n" % (rank, node, local_rank, posix.getpid())
    _append(_join(log_dir, RANKS_TSV), _fsencode(line))
    flags = posix.O_WRONLY | posix.O_CREAT | posix.O_APPEND
    target = posix.open(_join(log_dir, node_file(node)), flags, 0o666)
    read_end, write_end = posix.pipe()
    pid = posix.fork()
    if pid == 0:  # the pump
        code = 0
        try:
            posix.close(write_end)
            for name in HANDLED_SIGNALS:
                if hasattr(_signal, name):
                    _signal.signal(getattr(_signal, name), _signal.SIG_IGN)
            pump(read_end, target, _fsencode("[%s %d] " % (node, rank)))
        except BaseException:  # a pump that fails loses lines, never the rank
            code = 1
        posix._exit(code)
    posix.close(read_end)
    posix.close(target)
    _Pump.pid = pid
    return write_end


def pump(source: int, target: int, tag: bytes) -> None:
    """Copy `source` to `target` until its end, each line behind `tag`."""
    partial = b""
    while True:
        chunk = posix.read(source, 1 << 16)
        if not chunk:
            break
        lines = (partial + chunk).split(b"\n")
        partial = lines.pop()
        while len(partial) > _Pump.LINE_MAX:
            lines.append(partial[: _Pump.LINE_MAX])
            partial = partial[_Pump.LINE_MAX :]
        if lines:
            _write_lines(target, b"".join(tag + line + b"\n" for line in lines))
    if partial:  # the program's last line without its newline: ended here
        _write_lines(target, tag + partial + b"\n")


def _write_lines(target: int, data: bytes) -> None:
    """A full disk loses lines, never the program: the pump keeps reading (a pump that
    stopped would end the program with SIGPIPE)."""
    try:  # noqa: SIM105 - contextlib would be one more import
        _write_all(target, data)
    except OSError:
        pass


def end_pump(wait_s: float = 5.0) -> None:
    """Wait for the pump to write the program's last lines (it ends once every writer
    closed the pipe); a process the program left behind that holds the pipe open keeps
    it going, so at most `wait_s`."""
    deadline = time.monotonic() + wait_s
    pause = 0.0005  # the pump ends within a millisecond or so: ask often, then less
    while _Pump.pid:
        done, _ = posix.waitpid(_Pump.pid, posix.WNOHANG)
        if done or time.monotonic() >= deadline:
            _Pump.pid = 0
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def rank_logs(log_dir: str, rank: int, node: str, local_rank: int, shared: bool) -> Tuple[int, int]:
    """The program's stdout and stderr: its rank files, the pipe to its node file's pump
    (`shared`), or (-1, -1) when there is no log folder or it cannot be written."""
    if not log_dir:
        return -1, -1
    try:
        if shared:
            pipe = open_node_log(log_dir, rank, node, local_rank)
            return pipe, pipe
        return open_logs(log_dir, rank, node, local_rank)
    except OSError as exc:  # run anyway, output stays in the job's log
        _say("cannot write logs in %s: %s" % (log_dir, exc.strerror))
        return -1, -1


def _json_str(text: str) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code > 0xFFFF:  # outside the BMP: a surrogate pair, as JSON wants
            code -= 0x10000
            out.append("\\u%04x\\u%04x" % (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)))
        else:
            out.append("\\u%04x" % code)
    out.append('"')
    return "".join(out)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[posix.write(fd, view) :]


def _write_file(path: str, data: bytes) -> None:
    """``data`` written to a temporary name and renamed so readers never see half."""
    tmp = "%s.tmp.%d" % (path, posix.getpid())
    fd = posix.open(tmp, posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC, 0o666)
    try:
        _write_all(fd, data)
    finally:
        posix.close(fd)
    posix.replace(tmp, path)


def write_exit_file(
    log_dir: str, rank: int, node: str, returncode: int, shared: bool = False
) -> None:
    """rank-R.exit, written to a temporary name and renamed so readers never see half;
    `shared` (node files): the same record as one line appended to exits.jsonl."""
    path = _join(log_dir, EXITS if shared else RANK_FILE % (rank, EXIT))
    data = '{"rank": %d, "node": %s, "returncode": %d, "time": %r}\n' % (
        rank,
        _json_str(node),
        returncode,
        time.time(),
    )
    try:
        if shared:
            _append(path, data.encode("ascii"))
        else:
            _write_file(path, data.encode("ascii"))
    except OSError as exc:
        _say("cannot write %s: %s" % (path, exc.strerror))


def rank_event(
    run_dir: str, kind: str, rank: int, node: str, key: str, value: int, attempt: str = ""
) -> None:
    """Append ``{"event": kind, "rank", "node", key: value, "time"}`` to the run's
    events.jsonl: one write on O_APPEND, so the lines of many ranks never interleave.
    A requeued run's events also carry the attempt (its digits, as the shell set it).
    Events are for watching a run, so nothing here may fail or hold up the rank."""
    line = '{"event": "%s", "rank": %d, "node": %s, "%s": %d, %s"time": %r}\n' % (
        kind,
        rank,
        _json_str(node),
        key,
        value,
        '"attempt": %s, ' % attempt if attempt.isdigit() else "",
        time.time(),
    )
    try:
        flags = posix.O_WRONLY | posix.O_APPEND | posix.O_CREAT
        fd = posix.open(_join(run_dir, EVENTS), flags, 0o666)
    except OSError:
        return
    try:
        posix.write(fd, line.encode("ascii"))
    except OSError:
        pass
    finally:
        posix.close(fd)


class _Child:
    """What the signal handler needs: the child's pid (0 before it exists)."""

    pid = 0
    forward = False
    group = False  # the child leads a process group (a profiler): forward to all of it
    pending: List[int] = []  # noqa: RUF012 - one instance per process, never shared
    handled: List[int] = []  # noqa: RUF012 - the signals given _on_signal


def _signal_child(signum: int) -> None:
    if _Child.group:
        posix.killpg(_Child.pid, signum)
    else:
        posix.kill(_Child.pid, signum)


def _on_signal(signum: int, frame: Optional[FrameType]) -> None:
    if _Child.pid > 0:
        if _Child.forward:
            try:
                _signal_child(signum)
            except ProcessLookupError:
                return  # it has just exited; waitpid will tell
    elif _Child.pid == 0:
        # Before the child exists nobody else can deliver this signal to it: keep it.
        _Child.pending.append(signum)


class _Task:
    """Under podman: the srun task this rank's container belongs to (`podman run`, whose
    pid the container sees: --pid=host); 0 when none is watched."""

    pid = 0


def _check_task(signum: int, frame: Optional[FrameType]) -> None:
    """Each second: srun kills a step's other tasks outright (SIGKILL, --kill-on-bad-exit)
    when one fails, and a `podman run` killed so leaves its container running under
    conmon, outside the step (seen on the testbed: ranks alive after `hpclaunch cancel`).
    Its task gone, the rank ends its program as Slurm would have."""
    if _Task.pid <= 0 or _Child.pid <= 0:
        return
    try:
        posix.kill(_Task.pid, 0)
        return
    except ProcessLookupError:
        _Task.pid = 0
    except OSError:
        return  # alive (another user's: the pid is not ours to signal)
    try:
        _signal_child(_signal.SIGKILL)
    except ProcessLookupError:
        return  # it has just exited; waitpid will tell


def watch_task(env: Env) -> None:
    """Under podman (HPCLAUNCH_FORWARD_SIGNALS=always), watch SLURM_TASK_PID once a
    second (an interval timer: no thread, no import)."""
    task = env.get("SLURM_TASK_PID", "")
    if not task.isdigit() or int(task) == posix.getpid():
        return
    _Task.pid = int(task)
    _signal.signal(_signal.SIGALRM, _check_task)
    _signal.setitimer(_signal.ITIMER_REAL, 1.0, 1.0)


def install_signal_handlers(
    forward: bool, requeue_signal: Optional[int] = None, always: bool = False
) -> None:
    # Without forwarding Slurm / the local backend signal the program themselves, and the
    # bootstrap must outlive it to record its exit. With forwarding (torchrun) the signal
    # is passed on, unless the bootstrap leads its own process group: torch >= 2.2 starts
    # each worker in a new session and signals the whole group (killpg), which already
    # reaches the program; older torch signals only its direct child. `always` (podman:
    # the container's processes run under conmon, outside Slurm's step, and `podman run`
    # passes a signal to the container's first process alone, a session leader or not).
    # A Python handler (unlike SIG_IGN) is reset to the default by exec: the program
    # sees normal ones.
    _Child.forward = always or (forward and posix.getpgrp() != posix.getpid())
    for name in HANDLED_SIGNALS:
        signum = getattr(_signal, name, None)
        # A signal ignored by our parent stays ignored, for us and (inherited) the program;
        # but --requeue's, which the bootstrap in front of torchrun ignores on purpose.
        ignored = _signal.getsignal(signum) == _signal.SIG_IGN if signum is not None else True
        if signum is not None and (not ignored or signum == requeue_signal):
            _signal.signal(signum, _on_signal)
            _Child.handled.append(signum)


def spawn(
    args: List[str],
    env: Env,
    out: int,
    err: int,
    defaults: Tuple[int, ...] = (),
    group: bool = False,
) -> int:
    """The program (or its profiler) as a child; ``defaults``: more signals it gets with
    their default action; ``group``: in a process group of its own."""
    actions = []
    if out >= 0:
        actions.append((posix.POSIX_SPAWN_DUP2, out, 1))
        actions.append((posix.POSIX_SPAWN_DUP2, err, 2))
    # Python ignores SIGPIPE and SIGXFSZ for itself; like subprocess, restore the default
    # for the program (ignored dispositions would survive exec).
    reset = [getattr(_signal, s) for s in ("SIGPIPE", "SIGXFSZ") if hasattr(_signal, s)]
    requeue_signal = getattr(_signal, "SIG" + env.get(HPCLAUNCH_REQUEUE_SIGNAL, "-"), None)
    if requeue_signal is not None:  # ignored by a torchrun agent: the program's own again
        reset.append(requeue_signal)
    reset += defaults
    _export_path(env)
    if group:
        return posix.posix_spawnp(
            args[0], args, env, file_actions=actions, setsigdef=reset, setpgroup=0
        )
    return posix.posix_spawnp(args[0], args, env, file_actions=actions, setsigdef=reset)


def die_like(returncode: int) -> None:
    """Exit with the program's status; for a signal death, die of the same signal."""
    if returncode >= 0:
        posix._exit(returncode)
    signum = -returncode
    try:  # no second core dump of the bootstrap itself
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    try:
        if signum != _signal.SIGKILL:  # the one killing signal that takes no disposition
            _signal.signal(signum, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {signum})
        posix.kill(posix.getpid(), signum)
    except (OSError, ValueError):
        pass
    posix._exit(128 + signum)  # only when that signal does not end a process (SIGCHLD, ...)


def receive_env(fd: int, env: Env) -> None:
    """Take the task's variables from ``fd`` (NAME=VALUE, NUL-separated): a container
    runtime started with a clean environment sits between the task and this process.
    Only names matching HPCLAUNCH_CONTAINER_PASS (NAME or PREFIX*) are kept."""
    chunks = []
    while True:
        data = posix.read(fd, 1 << 16)
        if not data:
            break
        chunks.append(data)
    posix.close(fd)
    passed = {}
    for item in b"".join(chunks).split(b"\0"):
        key, sep, raw = item.partition(b"=")
        if sep and key:
            passed[_fsdecode(key)] = _fsdecode(raw)
    if HPCLAUNCH_CONTAINER_PASS not in passed:
        raise OSError("no %s among the variables received" % HPCLAUNCH_CONTAINER_PASS)
    patterns = passed[HPCLAUNCH_CONTAINER_PASS].split()
    exact = set(p for p in patterns if not p.endswith("*"))
    prefixes = tuple(p[:-1] for p in patterns if p.endswith("*"))
    for name, value in passed.items():
        if name in exact or name.startswith(prefixes) or name == HPCLAUNCH_CONTAINER_PASS:
            env[name] = value
    # ch-run leaves PATH unset once the environment is cleaned; programs (and
    # sys.executable) need one. Apptainer sets the image's own.
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


def activate_venv(env: Env) -> None:
    """What `source VENV/bin/activate` does, for HPCLAUNCH_VENV (no shell needed)."""
    venv = env.get(HPCLAUNCH_VENV)
    if venv and env.get("VIRTUAL_ENV") != venv:
        env["VIRTUAL_ENV"] = venv
        env["PATH"] = venv + "/bin:" + env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.pop("PYTHONHOME", None)


def enter(argv: List[str], env: Env) -> List[str]:
    """Handle the bootstrap's own leading options; returns argv without them."""
    if len(argv) > 1 and argv[1].startswith(ENV_FD_FLAG):
        fd = _int(argv[1][len(ENV_FD_FLAG) :], -1)
        try:
            receive_env(fd, env)
        except (OSError, ValueError) as exc:
            _say("the job's environment did not reach the container (fd %d): %s" % (fd, exc))
            posix._exit(125)
        argv = argv[:1] + argv[2:]
    activate_venv(env)
    if len(argv) > 1 and argv[1] == EXEC_FLAG:
        # In front of torchrun: set the environment up, then become the agent.
        env["PYTHONNOUSERSITE"] = "1"
        # srun passes --requeue's signal to every process of the task; torchrun's agent
        # would die of it (USR1/USR2 end a process by default) and take its workers with
        # it. Ignored here (kept through exec); each worker's bootstrap restores it.
        requeue_signal = getattr(_signal, "SIG" + env.get(HPCLAUNCH_REQUEUE_SIGNAL, "-"), None)
        if requeue_signal is not None:
            _signal.signal(requeue_signal, _signal.SIG_IGN)
        try:
            _execvpe(argv[2], argv[2:], env)
        except (OSError, IndexError) as exc:
            _say("cannot start %s: %s" % (argv[2:3], exc))
            posix._exit(127)
    return argv


def _unhex(encoded: str) -> List[str]:
    """Arguments that travel hex-encoded, comma-separated (any bytes, no quoting)."""
    return [_fsdecode(bytes.fromhex(h)) for h in encoded.split(",")]


def start(
    args: List[str],
    env: Env,
    out: int,
    err: int,
    defaults: Tuple[int, ...] = (),
    group: bool = False,
) -> Tuple[int, int, str]:
    """Spawn ``args`` as the child: (pid, 0, "") or, when it cannot start, (0, its exit
    status, why). Signals that arrived before it existed are passed on at once."""
    try:
        _Child.pid = spawn(args, env, out, err, defaults, group)
    except (FileNotFoundError, ValueError):  # ValueError: an empty program name
        return 0, 127, "command not found"
    except PermissionError:
        return 0, 126, "permission denied"
    except OSError as exc:  # e.g. ENOEXEC: a file that is no program
        return 0, 126, (exc.strerror or str(exc)).lower()
    _Child.group = group
    for signum in _Child.pending:
        try:
            _signal_child(signum)
        except ProcessLookupError:
            break
    del _Child.pending[:]
    return _Child.pid, 0, ""


def wait_child() -> int:
    """The child's returncode (negative: the signal that ended it)."""
    _, status = posix.waitpid(_Child.pid, 0)  # PEP 475: retried after each signal handler
    _Child.pid = -1  # reaped: its pid may be reused, never signal it again
    return -posix.WTERMSIG(status) if posix.WIFSIGNALED(status) else posix.WEXITSTATUS(status)


# ---- profiling chosen ranks (--profile-ranks, --profiler; docs/profiling.md)


def chosen_profiler(env: Env, rank: int) -> str:
    """The profiler this rank runs under ("" for none); tells the program in
    HPCLAUNCH_PROFILE whether it is a chosen rank (the torch profiler reads it)."""
    tool = env.get(HPCLAUNCH_PROFILER, "")
    if not tool:
        return ""
    chosen = str(rank) in [r.strip() for r in env.get(HPCLAUNCH_PROFILE_RANKS, "").split(",")]
    env[HPCLAUNCH_PROFILE] = "1" if chosen else "0"
    return tool if chosen else ""


def _which(name: str, path: str) -> Optional[str]:
    """An executable file ``name`` (a path, or searched on ``path``), or None."""
    candidates = [name] if "/" in name else [_join(d or ".", name) for d in path.split(":")]
    for candidate in candidates:
        if candidate and posix.access(candidate, posix.X_OK) and not _isdir(candidate):
            return candidate
    return None


def profiler_words(tool: str, env: Env, rank: int, attempt: str) -> Tuple[List[str], str]:
    """The profiler's words in front of the program, or why it cannot run here (then
    the rank runs unprofiled). The output is <profiles>/rank-R[.attempt-N].*"""
    folder = env.get(HPCLAUNCH_PROFILE_DIR, "")
    if not folder:
        return [], "%s is not set" % HPCLAUNCH_PROFILE_DIR
    try:  # also for torch: the program's trace handler writes there
        _makedirs(folder)
    except OSError as exc:
        return [], "cannot create %s: %s" % (folder, exc.strerror)
    if tool == "torch":
        return [], ""  # the program profiles itself: it reads HPCLAUNCH_PROFILE
    if tool not in ("py-spy", "nsys", "rocprof"):
        return [], "unknown profiler"
    path = env.get("PATH", DEFAULT_EXEC_PATH)
    # py-spy: the copy shipped beside the bootstrap (a static binary any image can run),
    # else one on PATH.
    shipped = _which(env.get(HPCLAUNCH_PYSPY, ""), "") if tool == "py-spy" else None
    exe = shipped or _which(tool, path)
    if exe is None:
        return [], "%s is not found here (PATH=%s)" % (tool, path)
    base = _join(folder, "rank-%d" % rank + (".attempt-" + attempt if attempt.isdigit() else ""))
    if tool == "py-spy":
        out = ["--format", "speedscope", "--output", base + ".speedscope.json", "--"]
        return [exe, "record", "--subprocesses", *out], ""
    if tool == "nsys":
        return [exe, "profile", "--output=" + base, "--force-overwrite=true"], ""
    return [exe, "--stats", "-o", base + ".csv"], ""


def _read_text(path: str) -> Optional[str]:
    try:
        fd = posix.open(path, posix.O_RDONLY)
    except OSError:
        return None
    try:
        return posix.read(fd, 4096).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        posix.close(fd)


def _remove(path: str) -> None:
    try:  # noqa: SIM105 - contextlib would be one more import
        posix.unlink(path)
    except OSError:
        pass


def _gone(pid: int) -> bool:
    try:
        posix.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # there, someone else's
    return False


def run_profiled(
    words: List[str], args: List[str], env: Env, logs: Tuple[int, int], errors: Tuple[int, ...]
) -> Tuple[int, int]:
    """The program under the profiler: (its returncode, its pid); pid 0 when the
    profiler never started it (the caller then runs it unprofiled).

    No profiler passes the program's exit status on (py-spy exits 0), so between the
    two runs this file again (``child``), which starts the program, waits and writes
    its status to a file. The profiler and that copy ignore the task's signals: Slurm
    sends SIGTERM to every process of a task, and a py-spy that dies of it writes no
    profile; the copy gives the program their default actions back."""
    folder = env.get(HPCLAUNCH_PROFILE_DIR, "")
    status = _join(folder, ".rank-%s.status.%d" % (env.get("RANK", "0"), posix.getpid()))
    here = __file__ if __file__[:1] == "/" else _join(posix.getcwd(), __file__)
    if here.endswith("/" + LOADED_AS):  # in a run folder: its loader runs cached bytecode,
        here = here[: -len(LOADED_AS)] + "bootstrap.py"  # so the copy starts in fewer ms
    signals = ",".join(str(s) for s in _Child.handled)
    inner = [sys.executable or "python3", "-I", "-S", here, CHILD_FLAG + signals + ":" + status]
    _remove(status)
    saved = [(s, _signal.signal(s, _signal.SIG_IGN)) for s in _Child.handled]
    try:
        # Under forwarding (an old torchrun signals the bootstrap only) the profiler
        # leads a group of its own, so a forwarded signal reaches the program too.
        pid, _, why = start(words + inner + args, env, logs[0], logs[1], (), _Child.forward)
    finally:
        for signum, handler in saved:
            _signal.signal(signum, handler)
    if why:
        _say("rank runs unprofiled: %s: %s" % (words[0], why), errors)
        return 0, 0
    profiler = wait_child()
    text = _read_text(status)
    _remove(status)
    if text is None:
        _say("%s ended (%d) before it started the program, which runs unprofiled"
             % (words[0], profiler), errors)  # fmt: skip
        return 0, 0
    lines = text.split("\n")
    pid = _int(lines[0], 0)
    if len(lines) > 2 and lines[1].lstrip("-").isdigit():
        return int(lines[1]), pid or -1  # -1: the program never started, nothing to rerun
    # The profiler ended first (killed its child): the program may still run.
    while pid > 0 and not _gone(pid):
        time.sleep(0.2)
    _say("%s ended (%d) before the program, whose exit status is unknown" % (words[0], profiler),
         errors)  # fmt: skip
    return (profiler if profiler else 1), pid


def child(argv: List[str]) -> int:
    """``bootstrap.py --hpclaunch-child=SIGNALS:STATUS PROGRAM...``, run by the profiler:
    start the program with SIGNALS at their default action, write "PID\\n" and then
    "PID\\nRETURNCODE\\n" to STATUS for the bootstrap, and end as the program did."""
    signals, _, status = argv[1][len(CHILD_FLAG) :].partition(":")
    defaults = tuple(n for n in (_int(s, 0) for s in signals.split(",")) if n > 0)
    if len(argv) < 3:
        return 2
    env = _environ()
    pid, returncode, why = start(argv[2:], env, -1, -1, defaults)
    if why:
        _say("%s: %s" % (argv[2], why))
    else:
        _write_status(status, "%d\n" % pid)
        returncode = wait_child()
    _write_status(status, "%d\n%d\n" % (pid, returncode))
    return returncode


def _write_status(path: str, text: str) -> None:
    try:
        _write_file(path, text.encode("ascii"))
    except OSError as exc:
        _say("cannot write %s: %s" % (path, exc.strerror))


# ---- --nccl-debug: each rank's NCCL_DEBUG_FILE into <logs>/nccl/rank-R.txt


def nccl_file(pattern: str, host: str, pid: int) -> str:
    """NCCL_DEBUG_FILE as NCCL names it: %h the host name (up to its first dot), %p the
    pid of the process, %% a percent sign; any other % pair is kept as it is."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        i += 1
        if ch != "%" or i == len(pattern):
            out.append(ch)
            continue
        code = pattern[i]
        i += 1
        out.append({"%": "%", "h": host, "p": str(pid)}.get(code, "%" + code))
    return "".join(out)


def collect_nccl(env: Env, log_dir: str, rank: int, pid: int, errors: Tuple[int, ...]) -> None:
    """Move the program's node-local debug file into the run's logs (appended, so a
    restarted rank adds to it). Nothing written (no communicator) is nothing to do."""
    pattern = env.get("NCCL_DEBUG_FILE", "")
    if env.get(HPCLAUNCH_NCCL_COLLECT) != "1" or not pattern or not log_dir or pid <= 0:
        return
    source = nccl_file(pattern, posix.uname().nodename.split(".")[0], pid)
    target = _join(_join(log_dir, NCCL_DIR), NCCL_FILE % rank)
    try:  # never a link: another user's, to a file of this user, would copy it out
        src = posix.open(source, posix.O_RDONLY | posix.O_NOFOLLOW)
    except FileNotFoundError:
        return
    except OSError as exc:
        _say("cannot read %s: %s" % (source, exc.strerror), errors)
        return
    try:
        _makedirs(_join(log_dir, NCCL_DIR))
        dst = posix.open(target, posix.O_WRONLY | posix.O_CREAT | posix.O_APPEND, 0o666)
        try:
            data = posix.read(src, 1 << 20)
            while data:
                _write_all(dst, data)
                data = posix.read(src, 1 << 20)
        finally:
            posix.close(dst)
    except OSError as exc:  # the node-local file stays: nothing is lost
        _say("cannot copy %s to %s: %s" % (source, target, exc.strerror), errors)
        return
    finally:
        posix.close(src)
    _remove(source)


def run(argv: List[str]) -> int:
    """Everything but the final exit; returns the program's returncode (negative: signal)."""
    env = _environ()
    argv = enter(argv, env)
    encoded = env.pop(HPCLAUNCH_ARGV, None)
    if encoded is not None and len(argv) < 2:
        # srun splits its command line at an argument that is exactly ":" (heterogeneous
        # steps), so such a program line travels here hex-encoded, comma-separated.
        argv = argv[:1] + _unhex(encoded)
    replaced = env.pop(HPCLAUNCH_POINT_PROGRAM, None)
    if replaced:  # a W&B point: the agent's command line, not the one job.sh names
        argv = argv[:1] + _unhex(replaced)
    extra = env.pop(HPCLAUNCH_POINT_ARGS, None)
    if extra:  # a sweep point's own arguments (a --configs .txt line), after the program's
        argv = argv + _unhex(extra)
    if len(argv) < 2:
        posix.write(2, b"usage: bootstrap.py PROGRAM [ARGS...]\n")
        return 2
    requeue_signal = getattr(_signal, "SIG" + env.get(HPCLAUNCH_REQUEUE_SIGNAL, "-"), None)
    forward = env.get(HPCLAUNCH_FORWARD_SIGNALS, "")
    install_signal_handlers(forward == "1", requeue_signal, always=forward == "always")
    if forward == "always":
        watch_task(env)
    set_rank_env(env)
    env["PYTHONNOUSERSITE"] = "1"  # ~/.local is bound into containers and shadows packages
    set_gpu_visibility(env)
    node = node_name(env)
    shown = node_label(env, node)
    local, lock, made_local = node_local(env, node)
    make_cache_dirs(env.get(HPCLAUNCH_CACHE_DIRS, ""))
    values = {name: env[var] for name, var in PLACEHOLDERS.items()}
    # A sweep point's parameters join the rank placeholders ({lr} beside {rank}).
    names = env.get(HPCLAUNCH_PARAM_NAMES)
    for name in filter(None, (names or "").split(",")):
        values.setdefault(name, env.get(PARAM_PREFIX + name.upper(), ""))
    args = [expand(arg, values, names is not None) for arg in argv[1:]]

    rank = _int(env["RANK"], 0)
    log_dir = env.get(HPCLAUNCH_LOG_DIR) or ""
    run_dir = env.get(HPCLAUNCH_RUN_DIR) or ""
    attempt = env.get(HPCLAUNCH_ATTEMPT, "")
    shared = env.pop(HPCLAUNCH_NODE_LOGS, "") == "1"
    out, err = rank_logs(log_dir, rank, shown, _int(env["LOCAL_RANK"], 0), shared)
    if run_dir:
        # Where rank 0 may leave its result (JSON) for the submitter: Run.result().
        env.setdefault(HPCLAUNCH_RESULT_FILE, run_dir + "/" + RESULT_JSON)
        # the task's pid, as in ranks.tsv (Slurm's SLURM_TASK_PID)
        rank_event(run_dir, RANK_START, rank, shown, "pid", posix.getpid(), attempt)

    errors = (err,) if err >= 0 else (2,)  # the rank's own log when there is one
    tool = chosen_profiler(env, rank)
    words: List[str] = []
    if tool:
        words, why_not = profiler_words(tool, env, rank, attempt)
        if why_not:
            _say("rank %d runs without %s: %s" % (rank, tool, why_not), errors)
    returncode, pid = 0, 0
    if words:
        returncode, pid = run_profiled(words, args, env, (out, err), errors)
    if not pid:
        pid, returncode, why = start(args, env, out, err)
        if why:
            _say("%s: %s" % (args[0], why), errors)
        else:
            returncode = wait_child()
    collect_nccl(env, log_dir, rank, pid, errors)
    if made_local:
        remove_local(env, local, lock, node)
    if out >= 0:
        posix.close(out)
        if err != out:
            posix.close(err)
    end_pump()
    if log_dir:
        write_exit_file(log_dir, rank, shown, returncode, shared)
    if run_dir:
        rank_event(run_dir, RANK_END, rank, shown, "returncode", returncode, attempt)
    return returncode


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith(CHILD_FLAG):
        die_like(child(sys.argv))
    die_like(run(sys.argv))


if __name__ == "__main__":
    main()
