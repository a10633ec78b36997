"""The code a remote run runs: the laptop's project, mirrored into the cluster's
~/.hpclaunch/projects/<name>-<id>/ with rsync over the master connection.

The mirror is kept between runs, so rsync sends only what changed since the last one.
It holds what git would snapshot (tracked files, untracked files that are not ignored)
and .git itself: the remote hpclaunch then snapshots, diffs and records the commit
exactly as on the login node. Git-ignored paths stay on the laptop; a program argument
naming one is refused before anything moves. Outside a git work tree nothing is shipped
unless the user names the folder (--ship DIR, up to [remote] ship_limit). Credentials
(snapshot.NEVER_SHIPPED: .env, .ssh/, *.pem, ...) never leave the laptop, whatever git
says; the shipping line names them.

Nothing on the cluster that the laptop did not ship is ever deleted: rsync's --delete
acts only inside .git; every other path there is protected, and prune() (run by the
cluster's hpclaunch after rsync) removes exactly the files an earlier ship sent that
the laptop no longer has, from the list kept beside the mirror. Outputs, logs and data
written into the mirror on the cluster (git-ignored or not) survive every re-ship.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpclaunch.basics.filemodes import write_atomic
from hpclaunch.basics.units import format_size
from hpclaunch.errors import UserError
from hpclaunch.payload.project import git, git_root
from hpclaunch.payload.snapshot import NEVER_SHIPPED, RUN_ID, STAGE_CACHE, never_shipped
from hpclaunch.remote.ssh import Connection

PROJECTS = ".hpclaunch/projects"  # relative to the remote home (ssh starts there)
# rsync patterns for hpclaunch's own output (snapshot.RUN_ID, snapshot.STAGE_CACHE):
_D = "[0-9]"
_H = "[0-9a-f]"
RUN_FOLDER = f"{_D * 8}-{_D * 6}-{_D * 3}-{_H * 4}/"
ALWAYS_OUT = ("- .stage-cache/", f"- {RUN_FOLDER}", "- __pycache__/")
_OUT_NAMES = (STAGE_CACHE, "__pycache__")
SHIP_LIMIT = 2 << 30  # --ship DIR's default size limit ([remote] ship_limit)
SENT = "hpclaunch-sent: "  # rsync's line for each item it sent (--out-format)
_WILD = re.compile(r"([*?\[\\])")


@dataclass(frozen=True)
class Shipped:
    remote_cwd: str  # where the remote hpclaunch starts (relative to the remote home)
    files: int  # files rsync sent
    names: tuple[str, ...]  # their paths, relative to the project
    bytes_moved: int  # bytes on the wire both ways, compression and protocol included
    withheld: tuple[str, ...] = ()  # credentials left on the laptop (NEVER_SHIPPED)
    mirror: str = ""  # the mirror's folder there, relative to the remote home
    listed: tuple[str, ...] = ()  # every file this ship holds (what prune() keeps)
    removed: int = 0  # files removed there because the laptop removed them (prune())


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


def _git_lists(root: Path) -> tuple[list[str], list[str]]:
    """(what git snapshots: tracked files still present and untracked ones not ignored;
    the ignored paths, folders once) relative to root."""

    def listed(args: list[str]) -> list[str]:
        out = git(root, ["ls-files", "-z", *args])
        raws = out.stdout.split(b"\0") if out.returncode == 0 else []
        return list(dict.fromkeys(os.fsdecode(raw).rstrip("/") for raw in raws if raw))

    kept = [
        rel
        for rel in listed(["--cached", "--others", "--exclude-standard"])
        if os.path.lexists(root / rel) and not _output(rel)
    ]
    return kept, listed(["--others", "--ignored", "--exclude-standard", "--directory"])


def _output(rel: str) -> bool:
    """hpclaunch's own output (ALWAYS_OUT): never shipped, never pruned."""
    return any(part in _OUT_NAMES or RUN_ID.fullmatch(part) for part in rel.split("/"))


def _walk(root: Path, limit_bytes: int) -> tuple[list[str], list[str]]:
    """A folder that is no git work tree (--ship DIR): every file but hpclaunch's output
    and credentials (those are returned apart); refused past limit_bytes."""
    files: list[str] = []
    withheld: list[str] = []
    total = 0
    for top, dirs, names in os.walk(root):
        rel_top = Path(top).relative_to(root).as_posix()
        for name in sorted(dirs + names):
            rel = name if rel_top == "." else f"{rel_top}/{name}"
            if _output(name):
                skip = True
            elif never_shipped(name):
                withheld.append(rel + ("/" if name in dirs else ""))
                skip = True
            else:
                skip = False
            if skip and name in dirs:
                dirs.remove(name)
            if skip or name in dirs:
                continue
            files.append(rel)
            info = os.lstat(os.path.join(top, name))
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
            if limit_bytes > 0 and total > limit_bytes:
                raise UserError(
                    "--ship",
                    f"{root} holds more than {format_size(limit_bytes)} to ship",
                    f"limit {format_size(limit_bytes)}, [remote] ship_limit",
                    "Ship a smaller folder (the code only: put data on the cluster), "
                    "or raise ship_limit in the cluster profile's [remote]",
                )
    return files, withheld


def _withheld(kept: Sequence[str]) -> tuple[list[str], list[str]]:
    """kept, less credentials; the credentials apart, each as its outermost credential
    file or folder (`.ssh/`, not every key in it)."""
    shipped: list[str] = []
    found: dict[str, None] = {}
    for rel in kept:
        if not never_shipped(rel):
            shipped.append(rel)
            continue
        parts = rel.split("/")
        first = next(i for i, part in enumerate(parts) if never_shipped(part))
        found["/".join(parts[: first + 1]) + ("/" if first < len(parts) - 1 else "")] = None
    return shipped, list(found)


def _rules(ignored_paths: Sequence[str]) -> list[str]:
    """rsync filter rules. Left out on both sides (never sent, never deleted there):
    hpclaunch's output, credentials, every path git ignores here. Deleted there when
    gone here: only what lies in .git (the history mirrors the laptop's exactly); every
    other file there is protected from --delete (`P *`) and removed, when the laptop
    removed it, by prune() from the list of what was shipped."""
    rules = list(ALWAYS_OUT)
    rules += [f"- {pattern}" for pattern in NEVER_SHIPPED]
    rules += ["- /" + _WILD.sub(r"\\\1", rel) for rel in ignored_paths]
    return [*rules, "R /.git/***", "P *"]


def ship_root(cwd: Path, folder: Optional[Path]) -> tuple[Path, bool]:
    """The folder to mirror and whether git lists its files: --ship DIR, else the git
    work tree holding cwd. Outside one, without --ship: refused (one line)."""
    if folder is not None:
        where = (cwd / folder).resolve()
        if not where.is_dir():
            raise UserError("--ship", f"{folder} is not a folder", "", "Name the folder to ship")
        top = git_root(where)
        return where, top is not None and top.resolve() == where
    top = git_root(cwd)
    if top is None:
        raise UserError(
            "--ship",
            f"{cwd} is not in a git work tree, so hpclaunch does not know what to ship",
            "",
            "Name the folder holding the code: --ship DIR (or make it a git repository)",
        )
    return top.resolve(), True


def ship(
    conn: Connection, cwd: Path, folder: Optional[Path] = None, limit_bytes: int = SHIP_LIMIT
) -> Shipped:
    """Mirror the project holding cwd (or --ship's folder); returns where the run starts
    on the cluster."""
    root, by_git = ship_root(cwd, folder)
    dest = f"{PROJECTS}/{mirror_name(root)}"
    if by_git:
        kept, ignored_paths = _git_lists(root)
        files, withheld = _withheld(kept)
    else:
        (files, withheld), ignored_paths = _walk(root, limit_bytes), []
    with tempfile.NamedTemporaryFile(
        "w", suffix=".rules", encoding="utf-8", errors="surrogateescape"
    ) as rules_file:
        rules_file.write("\n".join(_rules(ignored_paths)) + "\n")
        rules_file.flush()
        done = conn.rsync(
            [
                "-a",
                "-z",
                "--delete",
                # Nanoseconds in the quick check: an edit in the same second as the
                # last one, at the same size, was skipped (seen in the e2e test).
                "--modify-window=-1",
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
    here = cwd.resolve()
    rel = here.relative_to(root).as_posix() if here.is_relative_to(root) else "."
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
        withheld=tuple(withheld),
        mirror=dest,
        listed=tuple(files),
    )


def _ignored_there(mirror: Path, candidates: Sequence[str]) -> Optional[set[str]]:
    """The candidates the mirror's git ignores (its .gitignore files and .git are the
    laptop's, just shipped); None when git cannot say (then nothing is removed)."""
    if not candidates or not (mirror / ".git").is_dir():
        return set()
    try:
        done = subprocess.run(
            ["git", "--no-optional-locks", "check-ignore", "--no-index", "--stdin", "-z"],
            cwd=mirror,
            input=b"\0".join(os.fsencode(c) for c in candidates) + b"\0",
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode not in (0, 1):
        return None
    return {os.fsdecode(raw) for raw in done.stdout.split(b"\0") if raw}


def prune(mirror: Path, files: Sequence[str]) -> int:
    """On the cluster, after a ship: remove the files the previous ship sent (the list
    kept beside the mirror, <mirror>.shipped) that this one did not, then folders they
    leave empty; keep `files` as the new list. Nothing else is ever removed: outputs,
    logs and data written on the cluster stay, and so does a file the project ignores
    now (git asked in the mirror). Never through a symlink: a path whose folder is not
    the real folder inside the mirror is left alone."""
    listing = mirror.parent / f"{mirror.name}.shipped"
    try:
        before = set(json.loads(listing.read_text(encoding="utf-8", errors="surrogateescape")))
    except (OSError, ValueError):
        before = set()  # the first ship (or an older hpclaunch's mirror): nothing to remove
    real = os.path.realpath(mirror)
    removed = 0
    candidates = sorted((r for r in before - set(files) if isinstance(r, str)), reverse=True)
    ignored_now = _ignored_there(mirror, candidates)
    if ignored_now is None:
        candidates = []  # git could not say which are ignored now: remove none
    for rel in candidates:
        if ignored_now and rel in ignored_now:
            continue  # the project ignores it now: the cluster's copy may be a job's output
        parts = rel.split("/")
        if not parts or "" in parts or ".." in parts or "." in parts:
            continue
        path = os.path.join(real, *parts)
        if os.path.realpath(os.path.dirname(path)) != os.path.dirname(path):
            continue  # a symlinked folder on the way: not ours to follow
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                continue  # a submodule the laptop dropped: whatever lies in it stays
            os.unlink(path)
            removed += 1
        except OSError:
            continue
        for depth in range(len(parts) - 1, 0, -1):  # folders left empty, up to the mirror
            try:
                os.rmdir(os.path.join(real, *parts[:depth]))
            except OSError:
                break
    # Private whatever the projects folder's mode; ASCII (json escapes a name's undecodable
    # bytes, which json.loads gives back).
    write_atomic(listing, json.dumps(sorted(files)), share="private")
    return removed


def _stat(text: str, label: str) -> int:
    found = re.search(rf"^{re.escape(label)}: ([0-9,]+)", text, re.MULTILINE)
    return int(found.group(1).replace(",", "")) if found else 0
