"""--preflight and --spares inside a job: which nodes are fit to run the ranks.

Standard library only, never imports hpclaunch (hpclaunch/node/__init__.py's rules);
copied into the run folder and started with the nodes' ``python3 -I -S`` (Python >= 3.6,
as the stage guard and the GPU watch: LUMI's nodes have 3.6).

- ``preflight.py check --out DIR --gpus N --local PARENT [--min-free-mb M] [--container
  JSON]``: once per node, one task a node in an srun step before the ranks, outside
  any container: the doctor's node checks (hpclaunch/node/doctor_probe.py's, for
  pass/fail): the GPUs the job asked are visible to the step and listed by the node's
  tool (nvidia-smi / rocm-smi), the node-local folder is writable with space left, a
  small all-reduce over TCP among the step's tasks gives the right sum, and the
  container (a JSON argv: the runtime's exec line around `true`) starts. Writes
  DIR/<node>.json: {"node", "ok", "problems": [[kind, text], ...]}.
- ``preflight.py verdict --out DIR --nodes NODES --events FILE --attempt A``: on the
  batch host after that step: a node that failed a check or wrote nothing is bad (one
  ``node_bad`` event each in events.jsonl); prints the bad nodes, comma-joined.
- ``preflight.py place --nodes NODES --need N --avoid BAD --host HOST``: the nodes the
  ranks' srun must exclude: the bad ones and, while a spare is left, the batch host
  (its loss ends the job); exit 3 when fewer than N good nodes are left.
- ``preflight.py faults --nodes NODES --avoid BAD --events FILE --attempt A --since T
  --log-dir D --ranks W``: after a failed ranks' step, the nodes of the allocation that
  Slurm shows down or not responding (a node fault, not the program's failure); each
  gets a ``node_bad`` event; prints them comma-joined (nothing: the program failed).
- ``preflight.py lost --events FILE --attempt A --exclude-file F [--exclude USER]``: when
  attempt A-1 wrote its start and no end, its nodes Slurm shows down get ``node_bad`` and
  join the exclusion in F (an ``exclude`` event; printed; nothing: no node lost).

NODES is Slurm's compressed list ($SLURM_JOB_NODELIST); `scontrol show hostnames`
expands it on the batch host, once.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

EVENTS = "events.jsonl"  # = hpclaunch.node.EVENTS
NODE_BAD = "node_bad"  # = hpclaunch.node.NODE_BAD
RENDEZVOUS = ".allreduce"  # in DIR: the first task's address for the all-reduce
WAIT_S = 60.0  # the all-reduce: every task within this, or its node is bad
TOOL_TIMEOUT_S = 60
NO_SPARE = 3  # place's exit status: fewer good nodes than the ranks need
DOWN_STATES = ("down", "drain", "fail", "maint", "unk", "no_respond", "not_responding")

Problem = Tuple[str, str]


def node_name() -> str:
    # The bootstrap's rule: the same node has the same name in every file of a run.
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def write_json(path: str, data: Any) -> None:
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as handle:
        json.dump(data, handle)
    os.rename(tmp, path)


def append_event(events: str, data: Dict[str, Any]) -> None:
    line = json.dumps(dict(data, time=time.time())) + "\n"
    try:
        fd = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # the record misses a line; the job goes on


def gpu_problems(expected: int) -> List[Problem]:
    """The job's GPUs on this node: visible to the step and listed by the node's tool."""
    if expected <= 0:
        return []
    names = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
    shown = [os.environ[n] for n in names if os.environ.get(n, "") != ""]
    # Where Slurm binds GPUs to the step it names them; otherwise the tool's count decides.
    visible = len([g for g in shown[0].split(",") if g.strip()]) if shown else expected
    if visible < expected:
        return [("gpus", "%d of %d GPUs visible" % (visible, expected))]
    for argv, prefix in ((["nvidia-smi", "-L"], "GPU "), (["rocm-smi", "--showid"], "GPU[")):
        if shutil.which(argv[0]) is None:
            continue
        try:
            done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  timeout=TOOL_TIMEOUT_S)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [("gpus", "%s did not answer: %s" % (argv[0], exc))]
        text = done.stdout.decode(errors="replace")
        listed = len({line.split(":")[0] for line in text.splitlines()
                      if line.startswith(prefix)})  # fmt: skip
        if done.returncode != 0 or listed < expected:
            err = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
            why = " (%s)" % err[0] if err else ""
            return [("gpus", "%s lists %d of %d GPUs%s" % (argv[0], listed, expected, why))]
        return []
    return []  # no tool on the node: visibility is all there is to check


def local_problems(parent: str, min_free_mb: int) -> List[Problem]:
    """The node-local folder's parent: a file can be made there, and space is left."""
    if not parent:
        return []
    try:
        fd, name = tempfile.mkstemp(prefix=".hpclaunch-preflight-", dir=parent)
        os.close(fd)
        os.unlink(name)
        free_mb = shutil.disk_usage(parent).free // 2**20
    except OSError as exc:
        return [("local", "node-local folder %s: %s" % (parent, exc))]
    if free_mb < min_free_mb:
        return [("local", "node-local folder %s: %d MB free, below %d MB"
                 % (parent, free_mb, min_free_mb))]  # fmt: skip
    return []


def container_problems(argv_json: str) -> List[Problem]:
    if not argv_json:
        return []
    argv = json.loads(argv_json)
    try:
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=TOOL_TIMEOUT_S * 5)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [("container", "the container did not start: %s" % exc)]
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
        return [("container", "the container did not start (exit %d)%s"
                 % (done.returncode, ": " + err[0] if err else ""))]  # fmt: skip
    return []


def allreduce(out: str, rank: int, world: int) -> List[Problem]:
    """A sum over TCP among the step's tasks: task 0 listens (its address in a file of
    the shared run folder), the others send their value and check the total."""
    if world <= 1:
        return []
    spot = os.path.join(out, RENDEZVOUS)
    deadline = time.time() + WAIT_S
    if rank == 0:
        return serve(spot, world, deadline)
    while not os.path.exists(spot):
        if time.time() > deadline:
            return [("allreduce", "the first node never listened")]
        time.sleep(0.1)
    with open(spot) as handle:
        host, port = handle.read().split()
    try:
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as conn:
            conn.sendall(("%d %s\n" % (rank + 1, node_name())).encode())
            total = int(conn.makefile().readline() or "0")
    except (OSError, ValueError) as exc:
        return [("allreduce", "no all-reduce with %s: %s" % (host, exc))]
    if total != world * (world + 1) // 2:
        return [("allreduce", "all-reduce gave %d, not %d" % (total, world * (world + 1) // 2))]
    return []


def serve(spot: str, world: int, deadline: float) -> List[Problem]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("", 0))
    server.listen(world)
    tmp = spot + ".tmp"
    with open(tmp, "w") as handle:
        handle.write("%s %d\n" % (node_name(), server.getsockname()[1]))
    os.rename(tmp, spot)
    conns = []  # type: List[socket.socket]
    total = 1
    try:
        while len(conns) < world - 1 and time.time() < deadline:
            server.settimeout(max(0.1, deadline - time.time()))
            conn, _ = server.accept()
            conn.settimeout(WAIT_S)
            total += int(conn.makefile().readline().split()[0])
            conns.append(conn)
        for conn in conns:
            conn.sendall(("%d\n" % total).encode())
    except (OSError, ValueError, IndexError) as exc:
        return [("allreduce", "%d of %d nodes joined the all-reduce: %s"
                 % (len(conns) + 1, world, exc))]  # fmt: skip
    finally:
        for conn in conns:
            conn.close()
        server.close()
    return []


def check(args: argparse.Namespace) -> int:
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    world = int(os.environ.get("SLURM_NTASKS", "1"))
    problems = gpu_problems(args.gpus)
    problems += local_problems(args.local, args.min_free_mb)
    problems += container_problems(args.container)
    problems += allreduce(args.out, rank, world)
    data = {"node": node_name(), "rank": rank, "ok": not problems, "problems": problems}
    write_json(os.path.join(args.out, node_name() + ".json"), data)
    return 0


def hostnames(nodes: str) -> List[str]:
    """Slurm's compressed list expanded (scontrol, on the batch host, once)."""
    if "[" not in nodes:
        return [n for n in nodes.split(",") if n]
    done = subprocess.run(["scontrol", "show", "hostnames", nodes], stdout=subprocess.PIPE,
                          universal_newlines=True, check=True)  # fmt: skip
    return done.stdout.split()


def judge(results: Dict[str, Optional[Dict[str, Any]]]) -> Dict[str, str]:
    """node -> why it is bad. A node that wrote nothing is bad. An all-reduce failure
    counts against the first node (the one that listens) when that node is bad for
    another reason or wrote nothing, else against the node that reported it."""
    first = next((n for n, r in results.items() if r and r.get("rank") == 0), None)
    first_result = results.get(first) if first else None
    first_bad = first_result is None or any(
        kind != "allreduce" for kind, _ in first_result.get("problems", [])
    )
    bad = {}
    for name, result in results.items():
        if result is None:
            bad[name] = "preflight: no answer from the node"
            continue
        problems = result.get("problems", [])
        if (name == first) != first_bad:  # the all-reduce failed for another node's sake
            problems = [p for p in problems if p[0] != "allreduce"]
        if problems:
            bad[name] = "preflight: " + "; ".join(text for _, text in problems)
    return bad


def verdict(args: argparse.Namespace) -> int:
    results = {}  # type: Dict[str, Optional[Dict[str, Any]]]
    for name in hostnames(args.nodes):
        try:
            with open(os.path.join(args.out, name + ".json")) as handle:
                results[name] = json.load(handle)
        except (OSError, ValueError):
            results[name] = None
    bad = judge(results)
    for name, why in sorted(bad.items()):
        append_event(args.events, {"event": NODE_BAD, "attempt": args.attempt,
                                   "node": name, "why": why})  # fmt: skip
        sys.stderr.write("hpclaunch: node %s failed the %s\n" % (name, why))
    print(",".join(sorted(bad)))
    return 0


def avoid_list(nodes: List[str], need: int, avoid: List[str], host: str) -> Optional[List[str]]:
    """The nodes srun excludes, or None when fewer than `need` good nodes are left."""
    good = [n for n in nodes if n not in avoid]
    if len(good) < need:
        return None
    spare_left = len(good) > need
    return sorted(set(avoid) | ({host} if spare_left and host in good else set()))


def place(args: argparse.Namespace) -> int:
    avoid = [n for n in args.avoid.split(",") if n]
    found = avoid_list(hostnames(args.nodes), args.need, avoid, args.host)
    if found is None:
        return NO_SPARE
    print(",".join(found))
    return 0


def slurm_down(nodes: List[str]) -> List[str]:
    """The nodes sinfo shows down, drained, failing or not responding (a `*`)."""
    try:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T", "-n", ",".join(nodes)],
                              stdout=subprocess.PIPE, universal_newlines=True,
                              timeout=TOOL_TIMEOUT_S)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = set()
    for line in done.stdout.splitlines():
        name, _, state = line.partition(" ")
        state = state.lower()
        if name not in nodes:
            continue
        if state.endswith("*") or any(word in state for word in DOWN_STATES):
            found.add(name)
    return sorted(found)


def program_ended(log_dir: str, ranks: int, since: float) -> bool:
    """Every rank of this step wrote its exit file (the bootstrap does, whatever the
    program's status, also when srun ends the step): the program failed, no node did. A
    rank on a node that died never writes one."""
    for rank in range(ranks):
        try:
            if os.stat(os.path.join(log_dir, "rank-%d.exit" % rank)).st_mtime < since:
                return False
        except OSError:
            return False
    return True


def faults(args: argparse.Namespace) -> int:
    avoid = [n for n in args.avoid.split(",") if n]
    nodes = [n for n in hostnames(args.nodes) if n not in avoid]
    found = []  # type: List[str]
    if not program_ended(args.log_dir, args.ranks, args.since):
        # Slurm marks a lost node after SlurmdTimeout: look until then.
        deadline = time.time() + args.wait
        while not found and time.time() < deadline:
            found = slurm_down(nodes)
            if not found:
                time.sleep(1.0)
    for name in found:
        append_event(args.events, {"event": NODE_BAD, "attempt": args.attempt, "node": name,
                                   "why": "node fault: Slurm shows it down"})  # fmt: skip
    print(",".join(found))
    return 0


def previous_nodes(events: str, attempt: int) -> str:
    """The nodes of `attempt` when its batch shell wrote its start and no end, else ""."""
    nodes, ended = "", False  # the ranks' many lines are skipped unparsed (80,000 ranks)
    try:
        with open(events) as handle:
            for line in handle:
                whole = '"attempt_' in line and line.endswith("}\n")  # not one cut short
                data = json.loads(line) if whole else {}
                if not isinstance(data, dict) or data.get("attempt") != attempt:
                    continue
                if data.get("event") == "attempt_start":
                    nodes, ended = str(data.get("nodes") or ""), False
                elif data.get("event") == "attempt_end":
                    ended = True
    except (OSError, ValueError):
        return ""
    return "" if ended else nodes


def lost(args: argparse.Namespace) -> int:
    before = args.attempt - 1
    nodes = previous_nodes(args.events, before) if before >= 0 else ""
    found = slurm_down(hostnames(nodes)) if nodes else []
    why = "node fault: Slurm showed it down after attempt %d ended without its batch shell"
    for name in found:
        append_event(args.events, {"event": NODE_BAD, "attempt": before, "node": name,
                                   "why": why % before})  # fmt: skip
    if not found:
        return 0
    try:
        with open(args.exclude_file) as handle:
            merged = [n for n in handle.read().strip().split(",") if n]
    except OSError:
        merged = [n for n in args.exclude.split(",") if n]  # the user's --exclude
    merged += [n for n in found if n not in merged]
    text = ",".join(merged)
    with os.fdopen(os.open(args.exclude_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                   "w") as handle:  # fmt: skip
        handle.write(text + "\n")
    append_event(args.events, {"event": "exclude", "attempt": args.attempt, "nodes": text})
    print(text)
    return 0


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="preflight.py")
    sub = parser.add_subparsers(dest="what")
    one = sub.add_parser("check")
    one.add_argument("--out", required=True)
    one.add_argument("--gpus", type=int, default=0)
    one.add_argument("--local", default="")
    one.add_argument("--min-free-mb", type=int, default=100)  # a full disk, not a size
    one.add_argument("--container", default="")
    for name in ("verdict", "place", "faults"):
        each = sub.add_parser(name)
        each.add_argument("--nodes", required=True)
        each.add_argument("--avoid", default="")
        each.add_argument("--events", default="")
        each.add_argument("--attempt", type=int, default=0)
    sub.choices["verdict"].add_argument("--out", required=True)
    sub.choices["place"].add_argument("--need", type=int, required=True)
    sub.choices["place"].add_argument("--host", default="")
    for opt, kind, default in (("--since", float, 0.0), ("--log-dir", str, ""),
                               ("--ranks", int, 0), ("--wait", float, 90.0)):  # fmt: skip
        sub.choices["faults"].add_argument(opt, type=kind, default=default)
    gone = sub.add_parser("lost")
    for opt, kind, default in (("--events", str, ""), ("--attempt", int, 0),
                               ("--exclude-file", str, ""), ("--exclude", str, "")):  # fmt: skip
        gone.add_argument(opt, type=kind, default=default)
    args = parser.parse_args(argv)
    if args.what == "check":
        return check(args)
    return {"verdict": verdict, "place": place, "faults": faults, "lost": lost}[args.what](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
