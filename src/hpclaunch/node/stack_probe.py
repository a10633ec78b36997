"""`hpclaunch stack`'s probe: runs on each node with the node's own `python3 -I -S -c`
(its text: observe/stacks.py reads this file), Python >= 3.6, standard library only.

argv[1]: {"pyspy": [paths], "ranks": [[rank, node, pid]], "any_node": bool, "missing":
text}. Never fails: every rank gets one JSON line on stdout, {"rank", "node", "pid",
"threads"} or {"rank", "node", "error"[, "missing"]}. Messages name no pid, so that
equal ones group. For each of this node's ranks it checks that the pid is still that
rank's bootstrap, takes its child (descending further when the child is no Python, e.g.
a shell wrapper) and runs `py-spy dump --json` on it.
"""

import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

LIMIT = 20


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.uname()[1].split(".")[0]


def say(obj: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def find_pyspy(given: List[str]) -> Optional[str]:
    names = [p for p in given if p]
    names += [os.path.join(d, "py-spy") for d in os.environ.get("PATH", "").split(":") if d]
    for name in names:
        if os.path.isfile(name) and os.access(name, os.X_OK):
            return name
    return None


def children(pid: int) -> List[int]:
    found = []  # type: List[int]
    try:
        for task in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, task)) as fh:
                found += [int(x) for x in fh.read().split()]
        return found
    except (OSError, ValueError):
        pass
    for name in filter(str.isdigit, os.listdir("/proc")):  # no .../children: the ppids
        try:
            with open("/proc/%s/stat" % name) as fh:
                if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(name))
        except (OSError, ValueError, IndexError):
            pass
    return found


def is_bootstrap(pid: int) -> bool:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            words = fh.read().split(b"\0")
    except OSError:
        return False
    return any(w.endswith(b"bootstrap.py") for w in words)


def dump(spy: str, pid: int, nonblocking: bool = False) -> Tuple[Optional[Any], str]:
    # Under py-spy record (a profiled rank) a second tracer cannot pause the program:
    # read its memory without stopping it.
    extra = ["--nonblocking"] if nonblocking else []
    try:
        done = subprocess.run(
            [spy, "dump", "--json", *extra, "--pid", str(pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            universal_newlines=True,
            timeout=LIMIT,
        )
    except subprocess.TimeoutExpired:
        return None, "py-spy gave no answer in %d s" % LIMIT
    except OSError as exc:
        return None, "cannot run py-spy: %s" % exc.strerror
    if done.returncode == 0:
        try:
            return json.loads(done.stdout), ""
        except ValueError:
            return None, "py-spy printed no JSON"
    lines = [x.strip() for x in (done.stderr + done.stdout).splitlines() if x.strip()]
    text = lines[0] if lines else "exit %d" % done.returncode
    return None, "py-spy: " + text.replace(str(pid), "PID")


def rank(spy: str, number: int, pid: int, node: str) -> Dict[str, Any]:
    out = {"rank": number, "node": node}  # type: Dict[str, Any]
    if not is_bootstrap(pid):
        out["error"] = "its task has ended, or runs in a PID namespace of its own"
        return out
    queue, first, profiled = children(pid), "", False
    for _ in range(5):
        if not queue:
            break
        child = queue.pop(0)
        if is_bootstrap(child):  # a profiled rank: the bootstrap's copy under the profiler
            queue, profiled = queue + children(child), True
            continue
        threads, why = dump(spy, child, profiled)
        if threads is not None:
            out.update(pid=child, threads=threads)
            return out
        first = first or why
        queue += children(child)
    out["error"] = first or "its program has not started yet, or has just ended"
    return out


def main(argv: List[str]) -> None:
    args = json.loads(argv[1])
    node = node_name()
    spy = find_pyspy(args["pyspy"])
    for number, where, pid in args["ranks"]:
        if args["any_node"] or where == node:
            if spy is None:
                say({"rank": number, "node": node, "error": args["missing"], "missing": True})
            else:
                say(rank(spy, number, pid, node))


if __name__ == "__main__":
    main(sys.argv)
