"""A packed sweep's node agent (`sweep --pack`): one per node, one srun step for the whole
pack. It runs this node's slots: each takes the next point from the sweep's shared queue
(a file per point in <sweep>/pack/queue/, claimed by an atomic rename into taken/), runs
the point's ranks as processes with exactly the slot's GPUs visible and bound to its
cores, and takes the next point when that one ends.

    python3 -I -S pack_agent.py PACK_JSON [NODE]      run this node's slots
    python3 -I -S pack_agent.py PACK_JSON --requeue   put back what an attempt left taken

Every point is a run of its own: its folder, logs (the bootstrap's), events (point_start /
point_end as an array point's, with the slot's node, GPUs and cores), exit code. A failing
point runs again in its slot up to `retries` times; one past `point_time` is ended and
counted failed; one whose folder gets `cancelled` (hpclaunch cancel SWEEP:I) is ended and
its slot goes on. With --stage, the points' data variables name the node's staged folder
(the stage guard's, recorded in the sweep folder). Standard library only, Python >= 3.8;
never imports hpclaunch.
"""

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

Pack = Dict[str, Any]
Slot = Dict[str, Any]

EVENTS = "events.jsonl"
POINT_START, POINT_END = "point_start", "point_end"
PORT_BASE, PORT_SPAN = 20000, 12000
CANCELLED_FILE = "cancelled"
HPCLAUNCH_LOCAL_PARENT = "HPCLAUNCH_LOCAL_PARENT"
HPCLAUNCH_LOCAL_RECORD = "HPCLAUNCH_LOCAL_RECORD"
PARAMS_ENV = "params.env"
QUEUE, TAKEN, DONE = "queue", "taken", "done"
POLL_S = 0.2
KILL_GRACE_S = 10.0
# Slurm's per-task view of the agent's step: replaced by the point's own world, so that
# Lightning and JAX see the point, not the agent (as the bootstrap does under torchrun).
SLURM_PER_TASK = (
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASK_PID", "SLURM_GTIDS", "SLURM_CPU_BIND", "SLURM_CPU_BIND_TYPE",
    "SLURM_CPU_BIND_LIST", "SLURM_CPU_BIND_VERBOSE", "SLURM_STEP_NODELIST",
)  # fmt: skip


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def append_event(folder: str, event: Dict[str, Any]) -> None:
    """One O_APPEND write per line; a failed write never stops a point."""
    event.setdefault("time", time.time())
    try:
        fd = os.open(os.path.join(folder, EVENTS), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(event, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def claim(pack_dir: str) -> Optional[int]:
    """The next point of the queue, taken by an atomic rename (another node's agent that
    renames it first wins); None when the queue is empty."""
    queue = os.path.join(pack_dir, QUEUE)
    try:
        names = sorted((n for n in os.listdir(queue) if n.isdigit()), key=int)
    except OSError:
        return None
    for name in names:
        try:
            os.rename(os.path.join(queue, name), os.path.join(pack_dir, TAKEN, name))
        except OSError:
            continue
        return int(name)
    return None


def at_most(pack: Pack, pack_dir: str) -> bool:
    """Whether --max-parallel points run already (taken and not done, every allocation)."""
    most = int(pack.get("max_parallel") or 0)
    if not most:
        return False
    try:
        taken = set(os.listdir(os.path.join(pack_dir, TAKEN)))
        done = set(os.listdir(os.path.join(pack_dir, DONE)))
    except OSError:
        return False
    return len(taken - done) >= most


def requeue(pack_dir: str) -> None:
    """A new attempt of the allocation (--requeue): points taken and never done go back."""
    taken = os.path.join(pack_dir, TAKEN)
    for name in os.listdir(taken):
        if not os.path.exists(os.path.join(pack_dir, DONE, name)):
            os.rename(os.path.join(taken, name), os.path.join(pack_dir, QUEUE, name))


def read_params(path: str) -> List[Tuple[str, str]]:
    """An Optuna point's params.env (export NAME='value' lines) as pairs."""
    pairs = []
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            words = shlex.split(line, comments=True)
            for word in words[1:] if words[:1] == ["export"] else []:
                name, _, value = word.partition("=")
                pairs.append((name, value))
    return pairs


class Point:
    """One point running in one slot: its ranks' processes, one process group."""

    def __init__(self, pack: Pack, slot: Slot, index: int, job: str) -> None:
        self.pack, self.slot, self.index, self.job = pack, slot, index, job
        token = pack["token"]
        self.folder = pack["point_dir"].replace(token, str(index))
        self.tries = 0
        self.procs: List["subprocess.Popen[bytes]"] = []
        self.started = 0.0
        self.kill_at = 0.0
        self.killed = ""  # why the agent ended it: point-time, cancelled, memory

    def rank_env(self, rank: int, port: int) -> Dict[str, str]:
        pack, slot, tasks = self.pack, self.slot, self.pack["tasks_per_point"]
        token, index = pack["token"], str(self.index)
        env = {k: v for k, v in os.environ.items() if k not in SLURM_PER_TASK}
        env.update({k: v.replace(token, index) for k, v in pack["env"].items()})
        env.update(dict(pack["points"].get(index) or ()))
        params = os.path.join(self.folder, PARAMS_ENV)
        if pack.get("ask") and os.path.exists(params):
            env.update(dict(read_params(params)))
        host = pack.get("master_addr") or node_name()
        world = str(tasks)
        env.update(
            SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NODEID="0",
            SLURM_NTASKS=world, SLURM_NPROCS=world, SLURM_STEP_NUM_TASKS=world,
            SLURM_STEP_TASKS_PER_NODE=world, SLURM_TASKS_PER_NODE=world,
            SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST=host,
            MASTER_ADDR=host, MASTER_PORT=str(port),
        )  # fmt: skip
        for name in pack["gpu_vars"] if slot["gpus"] else ():
            env[name] = slot_devices(os.environ.get(name, ""), slot["gpus"])
        for name in pack["gpu_unset"] if slot["gpus"] else ():
            env.pop(name, None)
        env.setdefault("OMP_NUM_THREADS", str(max(1, len(slot["cpus"]) // tasks)))
        # the point's node-local folder, per try: the profile's default local_dir
        parent = os.environ.get("SLURM_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
        env[HPCLAUNCH_LOCAL_PARENT] = parent
        env[HPCLAUNCH_LOCAL_RECORD] = os.path.join(self.folder, "nodelocal-%d" % self.tries)
        return env

    def start(self, port: int) -> None:
        os.makedirs(os.path.join(self.folder, "logs"), mode=0o700, exist_ok=True)
        os.makedirs(self.pack["checkpoint_dir"].replace(self.pack["token"], str(self.index)),
                    mode=0o700, exist_ok=True)  # fmt: skip
        self.tries += 1
        self.killed = ""
        self.started = time.time()
        self.procs = []
        argv = [w.replace(self.pack["token"], str(self.index)) for w in self.pack["argv"]]
        cores = set(self.slot["cpus"]) & set(os.sched_getaffinity(0))
        group = 0
        for rank in range(self.pack["tasks_per_point"]):
            self.procs.append(subprocess.Popen(
                argv, env=self.rank_env(rank, port), cwd=self.pack["cwd"],
                stdin=subprocess.DEVNULL, preexec_fn=_in_slot(cores, group),
            ))  # fmt: skip
            group = group or self.procs[0].pid

    def returncode(self) -> Optional[int]:
        """None while a rank runs; else the first failing rank's code (0: all ended 0)."""
        codes = [p.poll() for p in self.procs]
        if any(c is None for c in codes):
            if any(c not in (None, 0) for c in codes):
                self.signal(signal.SIGTERM)  # one rank failed: the point's world is gone
            return None
        failed = [c for c in codes if c is not None and c != 0]
        # killed by signal N: 128 + N, as a shell reports it (and Slurm's exit codes)
        return (failed[0] if failed[0] > 0 else 128 - failed[0]) if failed else 0

    def signal(self, signum: int) -> None:
        with contextlib.suppress(OSError, IndexError):
            os.killpg(self.procs[0].pid, signum)

    def end(self, why: str) -> None:
        """Ask the point to end (SIGTERM to its group, SIGKILL after the grace)."""
        if not self.killed:
            self.killed = why
            self.kill_at = time.time() + KILL_GRACE_S
            self.signal(signal.SIGTERM)
        elif time.time() > self.kill_at:
            self.signal(signal.SIGKILL)


def slot_devices(visible: str, gpus: List[int]) -> str:
    """The slot's GPUs as the variable names them: the g-th of the devices Slurm gave the
    agent's step (CUDA_VISIBLE_DEVICES=4,5 -> slot GPU 1 is "5"), else g itself."""
    listed = [d.strip() for d in visible.split(",") if d.strip()]
    if len(listed) > max(gpus):
        return ",".join(listed[g] for g in gpus)
    return ",".join(str(g) for g in gpus)


def _in_slot(cores: Set[int], group: int) -> Callable[[], None]:
    """The rank's process: in the point's process group, bound to the slot's cores."""

    def enter() -> None:
        os.setpgid(0, group)
        if cores:
            os.sched_setaffinity(0, cores)

    return enter


RUNNING: Dict[int, "Point"] = {}  # this node's running points by slot, for the signal


def _ended_by(signum: int, frame: Any) -> None:
    """scancel, the time limit, Ctrl-C here: the running points' groups end too."""
    for point in list(RUNNING.values()):
        point.signal(signal.SIGTERM)
    sys.exit(128 + signum)


def run_node(pack: Pack, node: int) -> int:
    """Run this node's slots until the queue is empty and every point ended."""
    pack_dir = pack["pack_dir"]
    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID") or "local"
    job_no = int(job) if job.isdigit() else os.getpid()
    mine = [s for s in pack["slots"] if s["node"] == node]
    running = RUNNING  # slot number -> Point
    drained = False
    while True:
        for slot in mine:
            if slot["slot"] in running or drained:
                continue
            if at_most(pack, pack_dir):
                break  # --max-parallel points run across the allocations: wait for one
            index = claim(pack_dir)
            if index is None:
                drained = True
                break
            point = Point(pack, slot, index, job)
            if not ask(pack, point):
                finish(pack, point, 1, "ask failed")
                continue
            point.start(slot_port(job_no, slot, len(mine)))
            append_event(point.folder, start_event(point))
            running[slot["slot"]] = point
        if not running and drained:
            return 0
        time.sleep(POLL_S)
        memory = group_memory_mb() if pack.get("mem_per_point_mb") and running else {}
        for number, point in list(running.items()):
            code = watch(pack, point, memory)
            if code is None:
                continue
            if code != 0 and not point.killed and point.tries <= pack["retries"]:
                append_event(point.folder, {"event": "point_retry", "exit_code": code,
                                            "try": point.tries})  # fmt: skip
                point.start(slot_port(job_no, point.slot, len(mine)))
                continue
            del running[number]
            finish(pack, point, code, point.killed)


def slot_port(job_no: int, slot: Slot, per_node: int) -> int:
    """The point's MASTER_PORT: past the allocation's own (the batch script's), one per slot."""
    place = int(slot["node"]) * per_node + int(slot["slot"])
    return PORT_BASE + (job_no + 1 + place) % PORT_SPAN


def group_memory_mb() -> Dict[int, float]:
    """Resident memory (MB) per process group, from /proc: a point's ranks and their
    children share their first rank's group."""
    page_mb = os.sysconf("SC_PAGE_SIZE") / 1e6
    found: Dict[int, float] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid, "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        group, rss = int(fields[2]), int(fields[21])  # pgrp and rss (pages): proc(5)
        found[group] = found.get(group, 0.0) + rss * page_mb
    return found


def watch(pack: Pack, point: Point, memory: Dict[int, float]) -> Optional[int]:
    """The point's code once it ended; ends it past point_time, past its memory bound
    (--mem-per-point) or when cancelled."""
    code = point.returncode()
    if code is not None:
        return code
    limit, bound = pack.get("point_time"), pack.get("mem_per_point_mb")
    used = memory.get(point.procs[0].pid, 0.0) if point.procs else 0.0
    if limit and time.time() - point.started > limit:
        point.end("point-time")
    elif bound and used > bound:
        point.end("memory: %d MB above --mem-per-point %d MB" % (used, bound))
    elif os.path.exists(os.path.join(point.folder, CANCELLED_FILE)):
        point.end("cancelled")
    elif point.killed:
        point.end(point.killed)  # the grace is over: SIGKILL
    return None


def start_event(point: Point) -> Dict[str, Any]:
    slot = point.slot
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    return {
        "event": POINT_START, "job": point.job, "job_id": os.environ.get("SLURM_JOB_ID", ""),
        "task": "%s_%s" % (point.job, task) if task else "",
        "node": node_name(), "slot": slot["slot"], "gpus": slot["gpus"], "cpus": slot["cpus"],
        "try": point.tries, "pid": point.procs[0].pid if point.procs else 0,
    }  # fmt: skip


def finish(pack: Pack, point: Point, code: int, why: str) -> None:
    """The point's end: Optuna told, then its event and its done/ marker (an Optuna ask
    elsewhere counts a point without the marker alive, and `sweep status` one without
    the event: its trial is not failed before it is told)."""
    if pack.get("ask"):
        tell = [*pack["ask"], "tell", pack["sweep_dir"], str(point.index), str(code)]
        subprocess.run(tell, stdin=subprocess.DEVNULL, check=False)
    end = {"event": POINT_END, "job": point.job, "job_id": os.environ.get("SLURM_JOB_ID", ""),
           "node": node_name(), "exit_code": code, "slot": point.slot["slot"]}  # fmt: skip
    if why:
        end["reason"] = why
    append_event(point.folder, end)
    with contextlib.suppress(OSError):
        os.close(os.open(os.path.join(pack["pack_dir"], DONE, str(point.index)), os.O_CREAT, 0o600))


def staged_data(pack: Pack) -> bool:
    """--stage: the node's staged folder (made by its stage guard, which recorded its path
    in <records>/<node>.<job id>) in place of the placeholder in the points' variables;
    False when no guard recorded one on this node."""
    staged = pack.get("staged")
    if not staged:
        return True
    tag = os.environ.get("SLURM_JOB_ID") or "0"  # the guard's local_tag (no --requeue)
    record = os.path.join(staged["records"], "%s.%s" % (node_name(), tag))
    try:
        with open(record, encoding="utf-8", errors="surrogateescape") as fh:
            folder = fh.read()
    except OSError as exc:
        sys.stderr.write("hpclaunch: pack agent: no staged data on this node: %s\n" % exc)
        return False
    env = pack["env"]
    for name, value in env.items():
        env[name] = value.replace(staged["placeholder"], folder)
    return True


def ask(pack: Pack, point: Point) -> bool:
    """An Optuna point asks its trial before it starts (params.env); True when it may run."""
    if not pack.get("ask"):
        return True
    argv = [*pack["ask"], "ask", pack["sweep_dir"], str(point.index), point.job]
    return subprocess.run(argv, stdin=subprocess.DEVNULL, check=False).returncode == 0


def main(argv: List[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: pack_agent.py PACK_JSON [NODE | --requeue]\n")
        return 2
    with open(argv[1], encoding="utf-8") as fh:
        pack = json.load(fh)
    if argv[2:] == ["--requeue"]:
        requeue(pack["pack_dir"])
        return 0
    os.umask(0o077)
    if not staged_data(pack):
        return 1
    node = int(argv[2]) if len(argv) > 2 else int(os.environ.get("SLURM_NODEID") or 0)
    # scancel or the time limit: end every running point (its group), then exit.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _ended_by)
    return run_node(dict(pack), node)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
