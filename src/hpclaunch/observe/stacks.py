"""`hpclaunch stack`: the Python stack of every rank of a running run, grouped.

Where the ranks are: the bootstrap's `rank_start` events (events.jsonl) name each rank's
node and task pid (the bootstrap's; the program is its child). One `srun --jobid=J
--overlap` step with one task on each node that holds an asked rank runs NODE_CODE with
the node's `python3 -I -S`: for each of its ranks it checks that the pid is still that
rank's bootstrap, takes its child (descending further when the child is no Python, e.g. a
shell wrapper) and runs `py-spy dump --json` on it, printing one JSON line per rank.
Containers need nothing more: Charliecloud and Apptainer (by default) share the host's PID
namespace, so the recorded pid is the host's, and py-spy reads the image's interpreter
through /proc/PID/exe and /proc/PID/root. A local run's ranks are on this machine: the
same code runs here, without srun.

Grouping happens here: a rank's stack is its threads' frames (function, file, line),
thread ids, addresses and idle flags dropped, the main thread first; ranks whose stacks
are equal form one group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from hpclaunch import node
from hpclaunch.config.profilekinds import runs_here
from hpclaunch.errors import HpclaunchError
from hpclaunch.node import RANK_END, RANK_START
from hpclaunch.observe.attach import job_to_join
from hpclaunch.records.runrecord import RunRecord, event_lines
from hpclaunch.slurm import commands

PYSPY_FIX = "pip install 'hpclaunch[stack]' (or py-spy) where the nodes can run it"
TIMEOUT_S = 120.0  # the whole srun step; each py-spy gets NODE_CODE's own 20 s
MISSING = "py-spy is not installed on this node"

# Runs on each node with its own python3 -I -S -c (node/stack_probe.py's text).
NODE_CODE = node.path(node.STACK_PROBE).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Target:
    """A running rank: its node and its task's pid (the bootstrap)."""

    rank: int
    node: str
    pid: int


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int
    short_file: str = ""

    def show(self) -> str:
        return f"{self.function} ({self.short_file or self.file}:{self.line})"


@dataclass(frozen=True)
class Thread:
    name: str
    frames: tuple[Frame, ...]

    @property
    def key(self) -> tuple[tuple[str, str, int], ...]:
        return tuple((f.function, f.file, f.line) for f in self.frames)

    def to_dict(self) -> dict[str, Any]:
        frames = [{"function": f.function, "file": f.file, "line": f.line} for f in self.frames]
        return {"name": self.name, "frames": frames}


@dataclass
class Group:
    """Ranks whose stacks are equal (or who failed the same way: `error`)."""

    ranks: list[int]
    nodes: list[str]
    threads: tuple[Thread, ...] = ()
    error: str = ""
    pids: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ranks": self.ranks, "nodes": self.nodes}
        if self.error:
            return {**out, "error": self.error}
        pids = {str(r): p for r, p in self.pids.items()}
        return {**out, "pids": pids, "threads": [t.to_dict() for t in self.threads]}


def rank_tasks(record: RunRecord) -> tuple[dict[int, Target], dict[int, int]]:
    """The last attempt's ranks: those running (rank -> Target), those ended (rank ->
    returncode). A rank started again (torchrun restarts) counts by its last start."""
    attempts = record.events.attempts
    last = attempts[-1].number if attempts else None
    running: dict[int, Target] = {}
    ended: dict[int, int] = {}
    for event in event_lines(record.path):
        rank, pid = _int(event.get("rank")), _int(event.get("pid"))
        if rank is None or (last is not None and event.get("attempt", last) != last):
            continue
        if event.get("event") == RANK_START and pid is not None:
            running[rank] = Target(rank, str(event.get("node", "")), pid)
            ended.pop(rank, None)
        elif event.get("event") == RANK_END and rank in running:
            del running[rank]
            code = _int(event.get("returncode"))
            ended[rank] = -1 if code is None else code
    return running, ended


def _int(value: object) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def pyspy_paths(environ: Mapping[str, str]) -> list[str]:
    """Where this side's py-spy is: beside hpclaunch's own Python (the extra installs it
    into that venv, which a cluster's nodes usually see) and on PATH."""
    import shutil

    found = [os.path.join(os.path.dirname(sys.executable), "py-spy")]
    on_path = shutil.which("py-spy", path=environ.get("PATH"))
    if on_path:
        found.append(os.path.abspath(on_path))
    return [p for i, p in enumerate(found) if os.path.isfile(p) and p not in found[:i]]


def collect(
    record: RunRecord, targets: Sequence[Target], environ: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Every target's answer (one dict per rank), from one step on their nodes."""
    local = runs_here(record.backend)
    ranks = [[t.rank, t.node, t.pid] for t in targets]
    payload = {"pyspy": pyspy_paths(environ), "ranks": ranks, "any_node": local}
    code = ["-I", "-S", "-c", NODE_CODE, json.dumps({**payload, "missing": MISSING})]
    if local:  # the ranks are on this machine
        try:
            argv, env = [sys.executable, *code], dict(environ)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
            text = done.stdout
        except subprocess.TimeoutExpired:
            raise HpclaunchError(f"no stacks after {TIMEOUT_S:.0f} s") from None
    else:
        nodes = sorted({t.node for t in targets})
        argv = [
            "srun", f"--jobid={job_to_join(record)}", "--overlap", f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes)}", "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}",
            "--kill-on-bad-exit=0", "--quiet", "python3", *code,
        ]  # fmt: skip
        text = commands.run(argv, env=srun_env(environ), timeout=TIMEOUT_S)
    return answers(text, targets)


def srun_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without an allocation's SLURM_*/SRUN_* variables (inside
    another allocation they would shape the step); SLURM_CONF stays."""
    return {
        k: v
        for k, v in environ.items()
        if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SRUN_", "SBATCH_"))
    }


def answers(text: str, targets: Sequence[Target]) -> list[dict[str, Any]]:
    """The nodes' JSON lines (other lines: srun's own, ignored); a rank no node answered
    for gets an error of its own."""
    found: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and _int(item.get("rank")) is not None:
            found[item["rank"]] = item
    for t in targets:
        found.setdefault(t.rank, {"rank": t.rank, "node": t.node, "error": "no answer"})
    return [found[t.rank] for t in targets]


def threads_of(raw: object, pid: Optional[int]) -> tuple[Thread, ...]:
    """py-spy's threads, normalised: frames as (function, file, line); the main thread
    (its id is the process's pid) first, the others in the order of their frames."""
    if not isinstance(raw, list):
        return ()
    main: list[Thread] = []
    rest: list[Thread] = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        frames = tuple(_frame(f) for f in item.get("frames") or [] if isinstance(f, dict))
        is_main = pid is not None and item.get("os_thread_id") == pid
        name = item.get("thread_name") or ("main" if is_main else "")
        (main if is_main else rest).append(Thread(str(name), frames))
    return tuple(main + sorted(rest, key=lambda t: (t.key, t.name)))


def _frame(raw: dict[str, Any]) -> Frame:
    return Frame(
        function=str(raw.get("name") or "?"),
        file=str(raw.get("filename") or "?"),
        line=_int(raw.get("line")) or 0,
        short_file=str(raw.get("short_filename") or ""),
    )


def group(items: Sequence[dict[str, Any]]) -> list[Group]:
    """Ranks with equal stacks together; stacks first (by lowest rank), then errors."""
    by_key: dict[object, Group] = {}
    for item in sorted(items, key=lambda i: int(i["rank"])):
        rank, node = int(item["rank"]), str(item.get("node", ""))
        pid = _int(item.get("pid"))
        threads = () if "error" in item else threads_of(item.get("threads"), pid)
        error = str(item["error"]) if "error" in item else ""
        if not error and not threads:
            error = "py-spy found no Python thread"
        key: object = ("error", error) if error else tuple(t.key for t in threads)
        found = by_key.setdefault(key, Group([], [], threads, error))
        found.ranks.append(rank)
        if node not in found.nodes:
            found.nodes.append(node)
        if pid is not None:
            found.pids[rank] = pid
    return sorted(by_key.values(), key=lambda g: (bool(g.error), g.ranks[0]))


def missing_on(items: Sequence[dict[str, Any]]) -> list[str]:
    """Nodes that lack py-spy."""
    return sorted({str(i.get("node", "")) for i in items if i.get("missing")})


def rank_list(ranks: Iterable[int]) -> str:
    """0,2-4,7: runs of consecutive ranks as ranges."""
    parts: list[str] = []
    todo = sorted(set(ranks))
    while todo:
        first = last = todo.pop(0)
        while todo and todo[0] == last + 1:
            last = todo.pop(0)
        parts.append(str(first) if first == last else f"{first}-{last}")
    return ",".join(parts)


def render(groups: Sequence[Group]) -> list[str]:
    """The groups as text: a heading per group, then its frames, most recent call first."""
    out: list[str] = []
    for g in groups:
        what = f"rank {g.ranks[0]}" if len(g.ranks) == 1 else f"ranks {rank_list(g.ranks)}"
        where = f"{what} ({', '.join(g.nodes)})"
        if g.error:
            out.append(f"{where}: {g.error}")
            continue
        out.append(f"{where}:")
        for index, thread in enumerate(g.threads):
            if len(g.threads) > 1:
                out.append(f"  thread {thread.name or f'#{index + 1}'}:")
            out.extend(f"    {f.show()}" for f in thread.frames)
        out.append("")
    while out and not out[-1]:
        out.pop()
    return out
