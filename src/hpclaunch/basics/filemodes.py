"""What hpclaunch writes is private by default: folders 0700, files 0600, whatever the
umask. `share = "group"` (a profile's key, or `[run] share` in hpclaunch.toml, or
--share) makes run folders group-readable for a team (0750, 0640); nothing is ever
world-readable.

The run root, the experiment folders, run and sweep folders, their logs, records,
snapshots and diffs, the Optuna journal and the stage cache are made under `writing()`,
which sets the process's umask to the share's for the time hpclaunch writes (never while
it starts a job or a rank: the job keeps the user's own umask, and the run folder's mode
is what protects what it writes there). The per-user run index is always private.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

Share = Literal["private", "group"]
SHARES: tuple[Share, ...] = ("private", "group")
_UMASK = {"private": 0o077, "group": 0o027}


def umask_of(share: str) -> int:
    """The bits hpclaunch clears on what it makes (unknown shares count as private)."""
    return _UMASK.get(share, 0o077)


def dir_mode(share: str) -> int:
    return 0o777 & ~umask_of(share)


def file_mode(share: str) -> int:
    return 0o666 & ~umask_of(share)


def share_of(folder: Path) -> Share:
    """A folder's share, from its mode: files written later into a group-readable run
    folder (run.json's updates) are group-readable too, and only then."""
    try:
        mode = folder.stat().st_mode
    except OSError:
        return "private"
    return "group" if mode & stat.S_IRGRP and mode & stat.S_IXGRP else "private"


@contextlib.contextmanager
def writing(share: str) -> Iterator[None]:
    """The umask of hpclaunch's own writes, whatever the user's, restored after. Start no
    process (sbatch, a rank) inside: it would inherit this umask."""
    old = os.umask(umask_of(share))
    try:
        yield
    finally:
        os.umask(old)


def make_dirs(path: Path, share: str) -> None:
    """`mkdir -p` whose new folders get exactly the share's mode, whatever the umask;
    folders that exist keep theirs (a run root the user made stays as they made it)."""
    missing: list[Path] = []
    walk = path
    while not os.path.lexists(walk) and walk != walk.parent:
        missing.append(walk)
        walk = walk.parent
    mode = dir_mode(share)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode)  # the umask can only narrow it: never wider than mode
        except FileExistsError:
            continue  # made by a concurrent run meanwhile: theirs
        # A setgid bit inherited from a team's run root stays: it gives the files the group.
        os.chmod(folder, mode | (os.stat(folder).st_mode & stat.S_ISGID))
    if not path.is_dir():
        raise NotADirectoryError(20, "Not a directory", str(path))


def narrow(path: str, share: str) -> None:
    """A copied file (copy2 keeps the source's mode) narrowed to the share's bits."""
    st = os.lstat(path)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~umask_of(share))


def open_new(path: Path, flags: int, share: str) -> int:
    """os.open creating `path` with exactly the share's file mode (O_CREAT added)."""
    fd = os.open(path, flags | os.O_CREAT, file_mode(share))
    try:
        os.fchmod(fd, file_mode(share))
    except OSError:
        os.close(fd)
        raise
    return fd


def write_atomic(path: Path, text: str, share: Share | None = None) -> None:
    """`text` into `path` atomically (write aside, fsync, rename), with `share`'s mode, by
    default the folder's (0600, or 0640 in a group-shared folder); nothing aside is left
    on failure or a Ctrl-C."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if share is None:
        share = share_of(path.parent)
    try:
        fd = open_new(tmp, os.O_WRONLY | os.O_TRUNC, share)
        with open(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
