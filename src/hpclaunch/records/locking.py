"""One writer of a folder's record at a time, on file systems with and without flock.

run.json and sweep.json are read, changed and written back by several processes (a
`status` in one terminal, a `--wait` in another, a sweep's points). An flock on the
folder itself serialises them and leaves no file behind. Lustre's default mount, NFS
without a lock daemon and some FUSE file systems refuse flock (ENOLCK, EOPNOTSUPP,
EINVAL, ENOSYS): there the lock is a file made with O_EXCL beside the record
(`.hpclaunch.lock`), which holds "host pid start-time token". A lock file whose process
is gone (same host: the pid is free or now another process, told by its start time) or
that is older than STALE_AFTER_S (another host: record updates take milliseconds) is
stale and broken, so a process killed while it held the lock never blocks the run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from hpclaunch.errors import HpclaunchError

LOCK_FILE = ".hpclaunch.lock"
# flock's answers on file systems that do not support it: use the lock file instead.
NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS})
STALE_AFTER_S = 60.0  # another host's lock file this old is stale
WAIT_S = 120.0  # a live holder keeps the lock for milliseconds: waiting longer is a fault


class LockTimeout(HpclaunchError):
    """A lock file stayed taken by a live process for WAIT_S."""


@contextlib.contextmanager
def exclusive(folder: Path) -> Iterator[None]:
    """Hold the folder's lock: flock on the folder, else its lock file."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield  # no folder: nothing will be written anyway
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in NO_FLOCK:
                raise
            with lock_file(folder / LOCK_FILE):
                yield
            return
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def lock_file(path: Path, wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold an O_EXCL lock file; stale ones are broken, live ones waited for."""
    import socket  # here: only a file system that refuses flock needs it

    pid = os.getpid()
    mine = f"{socket.gethostname()} {pid} {process_start(pid)} {uuid.uuid4().hex}\n"
    deadline = time.monotonic() + wait_s
    pause = 0.005
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            _break_if_stale(path)
            if time.monotonic() > deadline:
                raise LockTimeout(
                    f"{path}: a lock file held for over {wait_s:.0f}s by a live process "
                    f"({_read(path).strip() or 'empty'}). Remove it if no hpclaunch "
                    "command is running for this folder"
                ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            continue
        try:
            os.write(fd, mine.encode())
        except OSError:
            mine = ""  # a full disk: an empty lock file, stale by its age if left behind
        finally:
            os.close(fd)
        break
    try:
        yield
    finally:
        if _read(path) == mine:  # never another process's lock that replaced a stale one
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""


def _break_if_stale(path: Path) -> None:
    """Remove a lock file whose holder is gone. It is renamed aside first, so of two
    processes that find it stale one removes it; a fresh lock renamed by mistake in the
    moment between is linked back."""
    seen = _read(path)
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return
    if not _is_stale(seen, age):
        return
    aside = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.stale")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if _read(aside) != seen:  # not the lock judged stale: give it back
        with contextlib.suppress(OSError):
            os.link(aside, path)
    with contextlib.suppress(OSError):
        os.unlink(aside)


def _is_stale(text: str, age: float) -> bool:
    import socket

    fields = text.split()
    if len(fields) != 4 or fields[0] != socket.gethostname():
        return age > STALE_AFTER_S  # another host's (or an empty) lock: by its age
    try:
        pid, started = int(fields[1]), float(fields[2])
    except ValueError:
        return age > STALE_AFTER_S
    return not same_process(pid, started)


def same_process(pid: int, started: Optional[float]) -> bool:
    """Whether `pid` is still the process that started at `started` (seconds since boot,
    from process_start; None: not recorded, any process of that pid counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: its start time tells whether it is the same
    return started is None or abs(process_start(pid) - started) < 1.0


def process_start(pid: int) -> float:
    """A process's start time in seconds since boot (Linux /proc), or 0.0."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return float(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def process_owner(pid: int) -> Optional[int]:
    """The uid a process runs as (Linux /proc), or None when it is gone or unknown."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
