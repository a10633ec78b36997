"""The code snapshot of a run: the project as git sees it, frozen at submission.

Tracked files (still present) and untracked files that are not ignored are copied into the
run directory, so edits after submission never change what a queued job runs. Ignored
entries (data, checkpoints, venvs) are symlinked instead: arguments naming them still
resolve, and big data is never copied. hpclaunch's own output is never in a snapshot:
the run root, when it lies inside the project, and wherever they are, run folders
(<exp>/<run-id>/) and stage caches (.stage-cache/) that earlier runs left there.
Credential files and folders (NEVER_SHIPPED: .env, .ssh/, *.pem, ...) are neither
copied nor linked, whatever git says of them.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpclaunch.basics import filemodes
from hpclaunch.basics.units import format_size
from hpclaunch.errors import UserError
from hpclaunch.payload.project import GIT_TIMEOUT, git_root, git_status
from hpclaunch.payload.project import git as _git

FIELD = "code snapshot"
FIX = "Use --no-snapshot to run the live project folder instead"
# Never copied out of nested trees (submodules, nested repositories): history is not code,
# and a nested .git folder can be gigabytes. __pycache__ is never linked either: the job
# would then write its compiled cache into the live project's folder.
SKIP_NAMES = frozenset({".git", "__pycache__"})
# hpclaunch's output, recognised wherever an earlier run put it: <run-root>/<exp>/<run-id>/
# (runpaths.new_run_id) and <run-root>/.stage-cache/ (stage.CACHE).
RUN_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9]{3}-[0-9a-f]{4}")
STAGE_CACHE = ".stage-cache"
# Credentials: never copied into a snapshot, never linked there, never shipped to a
# cluster (remote/ship.py), whatever git says of them. Matched against every component
# of a path, so a folder of that name is left out whole. fnmatch patterns, which
# remote/ship.py also hands to rsync as they are.
NEVER_SHIPPED = (
    *(".ssh", ".aws", ".gnupg", ".docker", ".netrc", ".pypirc", ".env", ".env.*"),
    *("*.pem", "*.key", "id_rsa*", "id_ed25519*", "id_ecdsa*", "credentials"),
)


@dataclass(frozen=True)
class SnapshotPlan:
    root: Path  # git top level
    files: tuple[str, ...]  # posix paths relative to root: copied (a folder = whole tree)
    links: tuple[str, ...]  # ignored entries, symlinked to root/<path>
    total_bytes: int
    largest: tuple[tuple[str, int], ...]  # the 5 biggest entries, biggest first
    left_out: tuple[str, ...] = ()  # run roots etc. inside root: never copied nor linked


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


def _tree(base: str, rel: str, gone: Callable[[str], bool]) -> Iterator[tuple[str, int]]:
    """(posix path relative to base, bytes) of every file and symlink in the copied folder
    base/rel, less what gone() leaves out."""
    with os.scandir(os.path.join(base, rel)) as entries:
        for entry in entries:
            sub = f"{rel}/{entry.name}"
            if entry.name in SKIP_NAMES or gone(sub):
                continue
            if entry.is_dir(follow_symlinks=False):
                yield from _tree(base, sub, gone)
            elif entry.is_symlink():
                yield sub, 0
            elif entry.is_file(follow_symlinks=False):
                yield sub, entry.stat(follow_symlinks=False).st_size


def _size(st: os.stat_result) -> int:
    return st.st_size if stat.S_ISREG(st.st_mode) else 0  # a symlink is copied, not followed


def inside(top: Path, paths: Iterable[Path]) -> tuple[str, ...]:
    """The paths strictly inside the project top, relative to it: each as it resolves (a
    run root may be a link into the project, the project reached through a link) and as it
    is named (a link in the project named as the run root). Never top or a folder above it:
    a run root there leaves only its run folders out (make() writes in one)."""
    real_top = os.path.realpath(top)
    found: list[str] = []
    for path in paths:
        full = os.path.abspath(path)
        named = os.path.join(os.path.realpath(os.path.dirname(full)), os.path.basename(full))
        for candidate in (os.path.realpath(full), named):
            rel = os.path.relpath(candidate, real_top)
            if rel not in (os.curdir, os.pardir) and not rel.startswith(os.pardir + os.sep):
                found.append(Path(rel).as_posix())
    # The outermost only: a folder under another left out one adds nothing.
    return tuple(
        rel for rel in dict.fromkeys(found) if not any(rel.startswith(o + "/") for o in found)
    )


# One search per path (a snapshot asks for every file): any component matching.
_NEVER = re.compile(
    "(?:^|/)(?:"
    + "|".join(re.escape(p).replace(r"\*", "[^/]*") for p in NEVER_SHIPPED)
    + ")(?:/|$)"
)


def never_shipped(rel: str) -> bool:
    """rel (a posix path) is, or lies in, a credential file or folder (NEVER_SHIPPED)."""
    return _NEVER.search(rel) is not None


_OUTPUT = re.compile(rf"(^|/)({re.escape(STAGE_CACHE)}|{RUN_ID.pattern})(/|$)")
# The same folders as git pathspecs, so that `git ls-files` prunes them instead of
# listing every file of earlier runs (a runs/ folder that is neither ignored nor the run
# root: 75,000 files took 1.5-2.5 s). Plain pathspecs match with fnmatch, whose `*`
# crosses slashes: `*/NAME/*` is everything under a folder NAME at any depth, and git
# matches a folder as `path/` while it walks, so it never enters one. gone() still
# decides (a file named NAME, GIT_LITERAL_PATHSPECS).
_RUN_ID_GLOB = "[0-9]" * 8 + "-" + "[0-9]" * 6 + "-" + "[0-9]" * 3 + "-" + "[0-9a-f]" * 4
OUTPUT_PATHSPECS = tuple(
    f":(exclude){prefix}{name}/*" for name in (_RUN_ID_GLOB, STAGE_CACHE) for prefix in ("", "*/")
)


def _gone(left_out: tuple[str, ...]) -> Callable[[str], bool]:
    """rel (relative to the top) is at or under a left-out folder, a run folder, a stage
    cache or a credential (NEVER_SHIPPED)."""

    def gone(rel: str) -> bool:
        if any(rel == out or rel.startswith(out + "/") for out in left_out):
            return True
        return _OUTPUT.search(rel) is not None or never_shipped(rel)

    return gone


def plan_snapshot(root: Path, leave_out: Iterable[Path] = ()) -> SnapshotPlan:
    """What make() copies and links, found with two `git ls-files` calls from the top level.
    leave_out: folders hpclaunch writes (the run root, ...), left out where they lie inside
    the project, ignored by git or not; run folders and stage caches always are."""
    top = git_root(root)
    if top is None:
        raise UserError(FIELD, f"{root} is not inside a git repository", "", FIX)
    base = str(top)
    left_out = inside(top, leave_out)
    gone = _gone(left_out)
    # git does not even walk them (a run root may hold thousands of files), nor run
    # folders and stage caches anywhere (OUTPUT_PATHSPECS); gone() decides, also when
    # GIT_LITERAL_PATHSPECS makes these plain names.
    paths = ["--", ".", *(f":(exclude,literal){rel}" for rel in left_out), *OUTPUT_PATHSPECS]
    sizes: dict[str, int] = {}
    for rel in _ls_files(top, ["--cached", "--others", "--exclude-standard", *paths]):
        if gone(rel):
            continue
        try:
            st = os.lstat(os.path.join(base, rel))
        except (FileNotFoundError, NotADirectoryError):
            continue  # tracked but deleted in the work tree: the job would not see it either
        if stat.S_ISDIR(st.st_mode):  # a submodule or a nested repository: the whole tree
            sizes[rel] = sum(size for _, size in _tree(base, rel, gone))
        elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            sizes[rel] = _size(st)
        # sockets and pipes are skipped: copying a named pipe blocks forever
    links = _links(top, paths, gone)
    files = tuple(sorted(sizes))
    largest = heapq.nlargest(5, ((rel, sizes[rel]) for rel in files), key=lambda kv: kv[1])
    return SnapshotPlan(top, files, links, sum(sizes.values()), tuple(largest), left_out)


def _links(top: Path, paths: list[str], gone: Callable[[str], bool]) -> tuple[str, ...]:
    """The ignored entries to link. An ignored folder holding a left-out one is linked whole:
    what the job writes there still lands in the live project."""
    ignored = ["--others", "--ignored", "--exclude-standard", "--directory", *paths]
    links: list[str] = []
    kept: set[str] = set()
    for rel in sorted(_ls_files(top, ignored)):
        parts = rel.split("/")
        # git lists a folder holding only ignored files both as "out/" and as "out/a.log":
        # keep the outermost, so nothing is ever created through a link into the project.
        if "__pycache__" in parts or any("/".join(parts[:i]) in kept for i in range(len(parts))):
            continue
        if gone(rel):
            continue
        kept.add(rel)
        links.append(rel)
    return tuple(links)


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
        f"limit {format_size(limit_bytes)}",
        f"Largest: {largest}; git-ignore them (they are then linked, not copied), "
        "raise --snapshot-limit, or use --no-snapshot",
    )


def make(p: SnapshotPlan, dest: Path, exclude: Optional[Path] = None) -> SnapshotStats:
    """Copy p.files into dest (a new folder) and link p.links; nothing that plan() left
    out, nor at/under exclude when that lies inside the project."""
    start = time.perf_counter()
    dest.mkdir(parents=True)  # FileExistsError if it exists: never mix two snapshots
    # copy2 keeps the project's modes (0644, 0755): narrowed to the run folder's share.
    share = filemodes.share_of(dest.parent)
    gone = _gone(p.left_out + inside(p.root, [] if exclude is None else [exclude]))
    copies: list[tuple[str, str]] = []  # source, target
    for rel in p.files:
        if gone(rel):
            continue
        src = os.path.join(p.root, rel)
        if os.path.isdir(src) and not os.path.islink(src):  # submodule: the whole tree
            copies += [
                (os.path.join(p.root, sub), os.path.join(dest, sub))
                for sub, _ in _tree(str(p.root), rel, gone)
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
                filemodes.narrow(target, share)
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
            if gone(rel) or os.path.lexists(target):
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(os.path.join(p.root, rel), target)
            links += 1
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)  # does not follow the links it removes
        raise
    return SnapshotStats(files, nbytes, links, time.perf_counter() - start)


def copy_snapshot(src: Path, dest: Path) -> SnapshotStats:
    """A rerun's own copy of an earlier run's snapshot (dest: a new folder), so that what
    the rerun writes relative to its working folder never lands in the earlier run's,
    nor in another rerun's. A reflink where the file system has them (`cp -a
    --reflink=auto`: no data copied), else a copy; never hard links, which would share
    the files. The links into the live project stay links."""
    start = time.perf_counter()
    if dest.exists():
        raise FileExistsError(errno.EEXIST, "the snapshot folder exists", str(dest))
    try:
        if shutil.which("cp") and sys.platform.startswith("linux"):
            argv = ["cp", "-a", "--reflink=auto", "--", str(src), str(dest)]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                said = done.stderr.strip().splitlines() or ["cp failed"]
                raise OSError(errno.EIO, said[-1])
        else:  # macOS and others: no --reflink; copy2 keeps modes and mtimes
            shutil.copytree(src, dest, symlinks=True)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    files = nbytes = links = 0
    for folder, _dirs, names in os.walk(dest):
        for name in names:
            info = os.lstat(os.path.join(folder, name))
            links += stat.S_ISLNK(info.st_mode)
            files += not stat.S_ISLNK(info.st_mode)
            nbytes += _size(info)
    return SnapshotStats(files, nbytes, links, time.perf_counter() - start)


@contextlib.contextmanager
def _index_copy(root: Path) -> Iterator[dict[str, str]]:
    """GIT_INDEX_FILE for a copy of the repository's index. `git diff` refreshes and
    rewrites the index even under --no-optional-locks (git 2.39, seen): on the user's own
    index that takes index.lock beside their git, and on a laptop's mirror it made the
    next ship send .git/index again."""
    found = _git(root, ["rev-parse", "--git-path", "index"], timeout=10)
    index = root / os.fsdecode(found.stdout).rstrip("\n")
    import tempfile  # not on a held sweep's path (bench/sweep_submit.py)

    with tempfile.TemporaryDirectory(prefix="hpclaunch-index-") as tmp:
        copy = os.path.join(tmp, "index")
        if found.returncode == 0 and index.is_file():
            # copy2: the copy keeps the index's mtime, which git's racy-entry check
            # compares against (a file rewritten in the same clock tick as the index, at
            # the same size, is looked at by content only while it is "racy"). A fresh
            # mtime hid such an edit from the diff (seen in CI).
            shutil.copy2(index, copy)
        yield {"GIT_INDEX_FILE": copy}


def diff(root: Path) -> str:
    """Staged and unstaged changes against HEAD as a binary patch; "" when clean or on a git
    error. Untracked files are not in it (they are in the snapshot). Undecodable bytes are
    surrogate-escaped: write with errors="surrogateescape" to get the exact patch back."""
    # Fixed prefixes, no colour, no external or textconv drivers: whatever the user's git
    # config says, `git apply` must take the patch as is.
    args = ["-c", "diff.relative=false", "diff", "--binary", "--no-color", "--no-ext-diff"]
    args += ["--no-textconv", "--submodule=short", "--src-prefix=a/", "--dst-prefix=b/"]
    # One status call says whether there is anything to diff: a clean tree (the common
    # case) costs no index copy and no diff (two git calls of a sweep's four).
    found = git_status(root)
    if found is None or not found[1]:
        return ""
    try:
        with _index_copy(root) as env:
            if found[0]:  # a commit to diff against
                # "--": a file may be named HEAD
                out, note = _git(root, [*args, "HEAD", "--"], extra_env=env), ""
            else:
                out = _git(root, [*args, "--cached", "--"], extra_env=env)
                note = (
                    "# hpclaunch: no commits yet; this is the staged content (git diff --cached)\n"
                )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if out.returncode != 0 or not out.stdout:
        return ""
    return note + out.stdout.decode("utf-8", "surrogateescape")
