"""A run's logs at scale, read back: node files (logs/node-<node>.log, every line tagged
`[node rank] ` by the bootstrap's pump), the exit records of every rank (rank-R.exit files,
or one exits.jsonl above the profile's node_logs_above), and the error digest of a failed
job (the first rank to fail, its last lines, how many ranks printed the same error).

Reads are bounded: a node file is read from its end, and the digest reads at most
`SCAN_BUDGET` bytes however many nodes the job had.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple, Optional

from hpclaunch.node import EXIT, EXITS, NODE_FILE, RANK_FILE

# node-<node>.log, as node.NODE_FILE names them: group 1 the node ("/" written as "_").
NODE_FILE_RE = re.compile(re.escape(NODE_FILE).replace("%s", "(.+)") + r"\Z")
_EXIT_FILE = re.compile(re.escape(RANK_FILE).replace("%d", r"(\d+)").replace("%s", EXIT) + r"\Z")
# Lines that look like a warning or an error: the console shows them from every rank.
LOOKS_BAD = re.compile(
    r"error|warn|exception|traceback|fatal|fail|abort|killed|out of memory|"
    r"segmentation fault|core dumped|\bnan\b",
    re.IGNORECASE,
)
TAIL_BYTES = 1 << 20  # the end of a node file the digest reads for the first rank's lines
SCAN_BUDGET = 64 << 20  # the most the digest reads to count the ranks of an error
LAST_LINES = 10


def node_file(node: str) -> str:
    """The node file's name (the bootstrap's node_file: a local run's label has a "/")."""
    return NODE_FILE % node.replace("/", "_")


def split_tag(line: bytes) -> Optional[tuple[str, int, bytes]]:
    """(node, rank, text) of a node file's line `[node rank] text`; None when untagged."""
    if not line.startswith(b"["):
        return None
    end = line.find(b"] ")
    if end < 0:
        return None
    node, _, rank = line[1:end].rpartition(b" ")
    if not node or not rank.isdigit():
        return None
    return node.decode("utf-8", "replace"), int(rank), line[end + 2 :]


class ExitRecord(NamedTuple):
    rank: int
    node: str
    returncode: int
    time: float


def parse_exit(text: str) -> Optional[ExitRecord]:
    """One rank's exit record (a rank-R.exit file or an exits.jsonl line); None if damaged."""
    try:
        record = json.loads(text)
        rank, rc, when = record["rank"], record["returncode"], float(record["time"])
    except (ValueError, KeyError, TypeError):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, rc)):
        return None
    return ExitRecord(rank, str(record.get("node", "?")), rc, when)


def exit_records(log_dir: Path) -> Iterator[ExitRecord]:
    """Every rank's exit record in a log folder, whichever way the ranks wrote them."""
    try:
        with os.scandir(log_dir) as it:
            names = [e.name for e in it]
    except OSError:
        return
    for name in names:
        if name == EXITS:
            texts = _read(Path(log_dir) / name).splitlines()
        elif _EXIT_FILE.match(name):
            texts = [_read(Path(log_dir) / name)]
        else:
            continue
        for text in texts:
            record = parse_exit(text)
            if record is not None:
                yield record


def first_failed(log_dir: Path) -> Optional[ExitRecord]:
    """The rank that failed first (earliest time; ties: the lower rank), or None."""
    failed = [r for r in exit_records(log_dir) if r.returncode != 0]
    return min(failed, key=lambda r: (r.time, r.rank)) if failed else None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def tail_lines(path: Path, budget: int) -> list[bytes]:
    """The complete lines in the last `budget` bytes of a file (none if unreadable)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - budget))
            data = f.read(budget)
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > budget:
        lines = lines[1:]  # cut in the middle
    return [line for line in lines if line]


def rank_lines(log_dir: Path, rank: int, node: str) -> list[str]:
    """The last lines of one rank: from its node's file, else its own rank files."""
    path = Path(log_dir) / node_file(node)
    if path.exists():
        mine = [t for t in map(split_tag, tail_lines(path, TAIL_BYTES)) if t and t[1] == rank]
        return [text.decode("utf-8", "replace") for _, _, text in mine[-LAST_LINES:]]
    lines: list[bytes] = []
    for kind in ("out", "err"):
        lines += tail_lines(Path(log_dir) / (RANK_FILE % (rank, kind)), TAIL_BYTES)
    return [line.decode("utf-8", "replace") for line in lines[-LAST_LINES:]]


def ranks_printing(log_dir: Path, text: str) -> set[int]:
    """The ranks whose recent lines hold `text` exactly (node files and rank files, the
    end of each, SCAN_BUDGET bytes in all)."""
    try:
        with os.scandir(log_dir) as it:
            paths = sorted(Path(e.path) for e in it if e.name.endswith((".log", ".out", ".err")))
    except OSError:
        return set()
    paths = [p for p in paths if p.name != "batch.out"]
    each = max(64 << 10, SCAN_BUDGET // max(1, len(paths)))
    wanted = text.encode("utf-8", "replace")
    ranks: set[int] = set()
    for path in paths:
        rank_of_file = _rank_of(path.name)
        for line in tail_lines(path, each):
            if rank_of_file is not None:
                if line == wanted:
                    ranks.add(rank_of_file)
            elif (tagged := split_tag(line)) is not None and tagged[2] == wanted:
                ranks.add(tagged[1])
    return ranks


def _rank_of(name: str) -> Optional[int]:
    head = name.split(".")[0]
    return int(head[5:]) if head.startswith("rank-") and head[5:].isdigit() else None


def show_ranks(ranks: list[int], shown: int = 3) -> str:
    """`ranks 3, 13, 23 ... (8 ranks)`: the first few, in order, and how many."""
    ordered = sorted(ranks)
    head = ", ".join(str(r) for r in ordered[:shown])
    more = " ..." if len(ordered) > shown else ""
    return f"ranks {head}{more} ({len(ordered)} ranks)"


def digest(log_dir: Path) -> list[str]:
    """The error digest of a failed job, lines to print; [] when no rank failed."""
    first = first_failed(log_dir)
    if first is None:
        return []
    code = 128 - first.returncode if first.returncode < 0 else first.returncode
    out = [f"hpclaunch: rank {first.rank} on {first.node} failed first (exit {code})"]
    lines = rank_lines(log_dir, first.rank, first.node)
    if lines:
        out.append(f"hpclaunch: its last {len(lines)} lines:")
        out += [f"  {line}" for line in lines]
        bad = [line for line in lines if LOOKS_BAD.search(line)]
        error = (bad or lines)[-1]
        ranks = ranks_printing(log_dir, error) | {first.rank}
        same = f"only rank {first.rank}" if len(ranks) == 1 else show_ranks(list(ranks))
        out.append(f"hpclaunch: {same} printed: {error}")
    return out
