"""The code snapshot of a run: the project as git sees it, frozen at submission.

Tracked files (still present) and untracked files that are not ignored are copied into the
run directory, so edits after submission never change what a queued job runs. Ignored
entries (data, checkpoints, venvs) are symlinked instead: arguments naming them still
resolve, and big data is never copied.
"""

from __future__ import annotations

import heapq
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .errors import UserError
from .project import GIT_TIMEOUT, git_root
from .project import git as _git

FIELD = "code snapshot"
FIX = "Use --no-snapshot to run the live project folder instead"
# Never copied out of nested trees (submodules, nested repositories): history is not code,
# and a nested .git folder can be gigabytes. __pycache__ is never linked either: the job
# would then write its compiled cache into the live project's folder.
SKIP_NAMES = frozenset({".git", "__pycache__"})


@dataclass(frozen=True)
class SnapshotPlan:
    root: Path  # git top level
    files: tuple[str, ...]  # posix paths relative to root: copied (a folder = whole tree)
    links: tuple[str, ...]  # ignored entries, symlinked to root/<path>
    total_bytes: int
    largest: tuple[tuple[str, int], ...]  # the 5 biggest entries, biggest first


@dataclass(frozen=True)
class SnapshotStats:
    files: int
    bytes: int
    links: int
    seconds: float


def _ls_files(root: Path, args: list[str]) -> list[str]:
    try:
        out = _git(root, ["ls-files", "-z", *args])
    except subprocess.TimeoutExpired:
        raise UserError(FIELD, "git ls-files took too long", f"{GIT_TIMEOUT} s", FIX) from None
    except OSError as exc:
        raise UserError(FIELD, f"cannot run git: {exc.strerror}", "", FIX) from None
    if out.returncode != 0:
        message = os.fsdecode(out.stderr).strip().splitlines() or ["failed"]
        raise UserError(FIELD, f"git ls-files: {message[0]}", "", FIX)
    # Nested repositories come as "dir/"; unmerged paths come once per stage.
    names = (os.fsdecode(raw).rstrip("/") for raw in out.stdout.split(b"\0") if raw)
    return list(dict.fromkeys(names))


def _tree(top: str, rel: str = "") -> Iterator[tuple[str, int]]:
    """(posix path relative to top, bytes) of every file and symlink in a copied folder."""
    with os.scandir(os.path.join(top, rel)) as entries:
        for entry in entries:
            if entry.name in SKIP_NAMES:
                continue
            sub = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                yield from _tree(top, sub)
            elif entry.is_symlink():
                yield sub, 0
            elif entry.is_file(follow_symlinks=False):
                yield sub, entry.stat(follow_symlinks=False).st_size


def _size(st: os.stat_result) -> int:
    return st.st_size if stat.S_ISREG(st.st_mode) else 0  # a symlink is copied, not followed


def plan(root: Path) -> SnapshotPlan:
    """What make() copies and links, found with two `git ls-files` calls from the top level."""
    top = git_root(root)
    if top is None:
        raise UserError(FIELD, f"{root} is not inside a git repository", "", FIX)
    base = str(top)
    sizes: dict[str, int] = {}
    for rel in _ls_files(top, ["--cached", "--others", "--exclude-standard"]):
        try:
            st = os.lstat(os.path.join(base, rel))
        except (FileNotFoundError, NotADirectoryError):
            continue  # tracked but deleted in the work tree: the job would not see it either
        if stat.S_ISDIR(st.st_mode):  # a submodule or a nested repository: the whole tree
            sizes[rel] = sum(size for _, size in _tree(os.path.join(base, rel)))
        elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            sizes[rel] = _size(st)
        # sockets and pipes are skipped: copying a named pipe blocks forever
    ignored = ["--others", "--ignored", "--exclude-standard", "--directory"]
    links: list[str] = []
    kept: set[str] = set()
    for rel in sorted(_ls_files(top, ignored)):
        parts = rel.split("/")
        # git lists a folder holding only ignored files both as "out/" and as "out/a.log":
        # keep the outermost, so nothing is ever created through a link into the project.
        if "__pycache__" in parts or any("/".join(parts[:i]) in kept for i in range(len(parts))):
            continue
        kept.add(rel)
        links.append(rel)
    files = tuple(sorted(sizes))
    largest = heapq.nlargest(5, ((rel, sizes[rel]) for rel in files), key=lambda kv: kv[1])
    return SnapshotPlan(top, files, tuple(links), sum(sizes.values()), tuple(largest))


def human(n: int) -> str:
    """Binary units, as Slurm sizes (200M = 200 MiB): 327573094 -> '312.4 MB'."""
    for unit, factor in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{n} B"


def _printable(rel: str) -> str:
    # Undecodable bytes in a file name would make printing the error line itself fail.
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def check_limit(p: SnapshotPlan, limit_bytes: int) -> None:
    """Refuse a snapshot bigger than limit_bytes (0 or less: no limit), naming the big files."""
    if limit_bytes <= 0 or p.total_bytes <= limit_bytes:
        return
    largest = ", ".join(f"{_printable(rel)} {human(size)}" for rel, size in p.largest)
    raise UserError(
        "--snapshot-limit",
        f"the code snapshot is {human(p.total_bytes)}",
        f"limit {human(limit_bytes).replace('.0 ', ' ')}",
        f"Largest: {largest}; git-ignore them (they are then linked, not copied), "
        "raise --snapshot-limit, or use --no-snapshot",
    )


def _under(rel: str, ex: Optional[str]) -> bool:
    return ex is not None and (ex in ("", rel) or rel.startswith(ex + "/"))


def _excluded(root: Path, exclude: Optional[Path]) -> Optional[str]:
    """exclude relative to root ("" = all of root); None when it is outside the project."""
    if exclude is None:
        return None
    # Resolved: git's top level is a real path, while the caller's may go through a
    # symlink (/home -> /gpfs/home on many clusters).
    real_root, real_ex = Path(os.path.realpath(root)), Path(os.path.realpath(exclude))
    if real_root == real_ex or real_ex in real_root.parents:
        return ""
    if real_root in real_ex.parents:
        return real_ex.relative_to(real_root).as_posix()
    return None


def make(p: SnapshotPlan, dest: Path, exclude: Optional[Path] = None) -> SnapshotStats:
    """Copy p.files into dest (a new folder) and link p.links; nothing from at/under exclude."""
    start = time.perf_counter()
    dest.mkdir(parents=True)  # FileExistsError if it exists: never mix two snapshots
    excluded = _excluded(p.root, exclude)
    copies: list[tuple[str, str]] = []  # source, target
    for rel in p.files:
        if _under(rel, excluded):
            continue
        src = os.path.join(p.root, rel)
        if os.path.isdir(src) and not os.path.islink(src):  # submodule: the whole tree
            copies += [
                (os.path.join(src, sub), os.path.join(dest, rel, sub))
                for sub, _ in _tree(src)
                if not _under(f"{rel}/{sub}", excluded)
            ]
        else:
            copies.append((src, os.path.join(dest, rel)))
    files = nbytes = links = 0
    made: set[str] = set()
    try:
        for src, target in copies:
            parent = os.path.dirname(target)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            try:
                # copy2: contents, mode and mtime; a symlink stays a symlink.
                shutil.copy2(src, target, follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted since plan(): as if deleted before
            except OSError as exc:
                what = f"cannot copy {_printable(os.path.relpath(src, p.root))}: {exc.strerror}"
                raise UserError(FIELD, what, "", FIX) from None
            files += 1
            nbytes += _size(os.lstat(target))
        # Links last, after every real folder exists: a copy never goes through a link and
        # so never writes into the live project.
        for rel in p.links:
            target = os.path.join(dest, rel)
            if _under(rel, excluded) or os.path.lexists(target):
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(os.path.join(p.root, rel), target)
            links += 1
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)  # does not follow the links it removes
        raise
    return SnapshotStats(files, nbytes, links, time.perf_counter() - start)


def diff(root: Path) -> str:
    """Staged and unstaged changes against HEAD as a binary patch; "" when clean or on a git
    error. Untracked files are not in it (they are in the snapshot). Undecodable bytes are
    surrogate-escaped: write with errors="surrogateescape" to get the exact patch back."""
    # Fixed prefixes, no colour, no external or textconv drivers: whatever the user's git
    # config says, `git apply` must take the patch as is.
    args = ["-c", "diff.relative=false", "diff", "--binary", "--no-color", "--no-ext-diff"]
    args += ["--no-textconv", "--submodule=short", "--src-prefix=a/", "--dst-prefix=b/"]
    try:
        if _git(root, ["rev-parse", "-q", "--verify", "HEAD"], timeout=10).returncode == 0:
            out, note = _git(root, [*args, "HEAD", "--"]), ""  # "--": a file may be named HEAD
        else:
            out = _git(root, [*args, "--cached", "--"])
            note = "# hpclaunch: no commits yet; this is the staged content (git diff --cached)\n"
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if out.returncode != 0 or not out.stdout:
        return ""
    return note + out.stdout.decode("utf-8", "surrogateescape")
