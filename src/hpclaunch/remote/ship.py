"""The code a remote run runs: the laptop's project, mirrored into the cluster's
~/.hpclaunch/projects/<name>-<id>/ with rsync over the master connection.

The mirror is kept between runs, so rsync sends only what changed since the last one.
It holds what git would snapshot (tracked files, untracked files that are not ignored)
and .git itself: the remote hpclaunch then snapshots, diffs and records the commit
exactly as on the login node. Git-ignored paths stay on the laptop; a program argument
naming one is refused before anything moves. rsync's exclude rules also protect, on the
cluster, hpclaunch's output that a relative run root put inside the mirror (run folders,
stage caches): --delete never touches them.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import UserError
from ..project import git, git_root
from .ssh import Connection

PROJECTS = ".hpclaunch/projects"  # relative to the remote home (ssh starts there)
# rsync patterns for hpclaunch's own output (snapshot.RUN_ID, snapshot.STAGE_CACHE):
_D = "[0-9]"
_H = "[0-9a-f]"
RUN_FOLDER = f"{_D * 8}-{_D * 6}-{_D * 3}-{_H * 4}/"
ALWAYS_OUT = ("- .stage-cache/", f"- {RUN_FOLDER}", "- __pycache__/")
SENT = "hpclaunch-sent: "  # rsync's line for each item it sent (--out-format)
_WILD = re.compile(r"([*?\[\\])")


@dataclass(frozen=True)
class Shipped:
    remote_cwd: str  # where the remote hpclaunch starts (relative to the remote home)
    files: int  # files rsync sent
    names: tuple[str, ...]  # their paths, relative to the project
    bytes_moved: int  # bytes on the wire both ways, compression and protocol included


def mirror_name(root: Path) -> str:
    """One mirror per laptop project: its folder's name and a hash of host and path."""
    key = f"{socket.gethostname()}:{root.resolve()}"
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", root.name)[:40] or "project"
    return f"{safe}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


def ignored(root: Path, candidates: Sequence[str]) -> list[str]:
    """The candidates (paths relative to root) that git ignores."""
    if not candidates:
        return []
    try:
        done = subprocess.run(
            ["git", "--no-optional-locks", "check-ignore", "--stdin", "-z"],
            cwd=root,
            input="\0".join(candidates).encode() + b"\0",
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [os.fsdecode(raw) for raw in done.stdout.split(b"\0") if raw]


def refuse_ignored(root: Optional[Path], cwd: Path, program: Sequence[str], host: str) -> None:
    """A program argument that names a git-ignored path of the laptop: one line, the way
    out. Words like --data=x are looked at after the `=`."""
    if root is None:
        return
    named: dict[str, str] = {}
    for word in program:
        value = word.partition("=")[2] if word.startswith("-") and "=" in word else word
        if not value or "\0" in value:
            continue
        path = (cwd / value).resolve() if not os.path.isabs(value) else Path(value)
        if path.exists() and path.is_relative_to(root.resolve()):
            named.setdefault(path.relative_to(root.resolve()).as_posix(), word)
    for rel in ignored(root, sorted(named)):
        raise UserError(
            named[rel],
            f"git ignores {rel}, so it stays on this machine and is not shipped to {host}",
            "only the code crosses",
            "Put it on the cluster and pass its path there (or --stage it from there)",
        )


def _exclude_rules(root: Path) -> list[str]:
    """rsync filter rules: hpclaunch's output anywhere, then every ignored path git lists
    (anchored, wildcards escaped)."""
    out = git(
        root, ["ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"]
    )
    rules = list(ALWAYS_OUT)
    for raw in out.stdout.split(b"\0") if out.returncode == 0 else []:
        if raw:
            rules.append("- /" + _WILD.sub(r"\\\1", os.fsdecode(raw)))
    return rules


def ship(conn: Connection, cwd: Path) -> Shipped:
    """Mirror the project holding cwd; returns where the run starts on the cluster."""
    root = git_root(cwd) or cwd
    dest = f"{PROJECTS}/{mirror_name(root)}"
    rules = _exclude_rules(root) if git_root(cwd) else list(ALWAYS_OUT)
    with tempfile.NamedTemporaryFile(
        "w", suffix=".rules", encoding="utf-8", errors="surrogateescape"
    ) as rules_file:
        rules_file.write("\n".join(rules) + "\n")
        rules_file.flush()
        done = conn.rsync(
            [
                "-a",
                "-z",
                "--delete",
                "--stats",
                f"--out-format={SENT}%n",
                f"--filter=merge {rules_file.name}",
                f"{root}/",
                f":{dest}/",
            ],
            make_dir=PROJECTS,
        )
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise UserError(
            "code",
            f"rsync to {conn.host.name}:{dest} failed ({said})",
            "",
            "Check that rsync is installed there (hpclaunch remote check)",
        )
    rel = cwd.resolve().relative_to(root.resolve()).as_posix()
    return Shipped(
        remote_cwd=dest if rel == "." else f"{dest}/{rel}",
        files=_stat(done.stdout, "Number of regular files transferred"),
        names=tuple(
            line[len(SENT) :]
            for line in done.stdout.splitlines()
            if line.startswith(SENT) and not line.endswith("/")
        ),
        bytes_moved=_stat(done.stdout, "Total bytes sent")
        + _stat(done.stdout, "Total bytes received"),
    )


def _stat(text: str, label: str) -> int:
    found = re.search(rf"^{re.escape(label)}: ([0-9,]+)", text, re.MULTILINE)
    return int(found.group(1).replace(",", "")) if found else 0
