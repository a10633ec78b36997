"""--stage and --stage-out on the submitting side: parse, pack once (cached), check the
node-local capacity, and describe the job's staging for the nodes (stage.json).

A directory is packed into a few tars (one folder of them) kept under the run root
(.stage-cache/<NAME>-<key>/), keyed by a manifest of its paths, sizes and mtimes: an
unchanged dataset reuses the same files, a touched one packs again. Each node then reads
those few big files instead of every small one (node/stage_guard.py), side by side,
which is what makes many small files cheap on a parallel file system.

Only folders, regular files and symlinks to them are staged: a FIFO, a device or a
socket (the source, or anywhere in its tree) is refused from its type before anything
is opened, and what the user cannot read is named before packing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Optional, TextIO

from hpclaunch.basics.units import format_memory
from hpclaunch.config.jobspec import StageItem
from hpclaunch.errors import UserError, show
from hpclaunch.node import ARCHIVE, DIRECTORY, FILE, LINKS_PART, PACK_PART, SQUASHFS
from hpclaunch.payload.containers import SQUASHFS_MAGIC
from hpclaunch.payload.snapshot import human
from hpclaunch.payload.stagepack import check_pack, tar_part
from hpclaunch.payload.stagepack import parts as parts
from hpclaunch.payload.stagepack import split as split
from hpclaunch.records.runpaths import absolute

if TYPE_CHECKING:
    from hpclaunch.payload.stagecache import Limits

ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".tzst", ".tar.xz", ".tar.bz2")
CACHE = ".stage-cache"
PACK_FORMAT = b"pack-2\0"  # part of every pack's key: a new format never reuses an old pack
_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def default_name(src: str) -> str:
    base = os.path.basename(os.path.normpath(src)) or "DATA"
    return re.sub(r"[^A-Z0-9]", "_", base.upper())


def parse(text: str, cwd: Path) -> tuple[str, str]:
    """SRC[:NAME] -> (absolute SRC, NAME); the source must exist."""
    src, name = text, ""
    head, sep, tail = text.rpartition(":")
    if sep and head and _NAME.match(tail):
        src, name = head, tail.upper()
    path = os.path.normpath(absolute(src, cwd))
    if not os.path.exists(path):
        raise UserError("--stage", f"{path} does not exist", "", "Fix the path")
    return path, name or default_name(path)


# What a file that is neither a folder, a regular file nor a symlink is, in words.
SPECIAL = {stat.S_IFIFO: "FIFO", stat.S_IFCHR: "character device",
           stat.S_IFBLK: "block device", stat.S_IFSOCK: "socket"}  # fmt: skip
SHOWN = 3  # problem entries a refusal names before "and N more"


def _is_data(mode: int) -> bool:
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode)


def _special(path: str, mode: int) -> str:
    """'a FIFO', or for a symlink 'a symlink to the FIFO /p', or '' when path is data
    (a folder, a regular file, a symlink to one or a dangling symlink: staged as a link).
    os.stat follows a link without opening what it finds."""
    if stat.S_ISLNK(mode):
        with contextlib.suppress(OSError):
            target = os.stat(path).st_mode
            if not _is_data(target):
                noun = SPECIAL.get(stat.S_IFMT(target), "special file")
                return f"a symlink to the {noun} {os.path.realpath(path)}"
        return ""
    return "" if _is_data(mode) else f"a {SPECIAL.get(stat.S_IFMT(mode), 'special file')}"


def _cannot_read(path: str, reason: str = os.strerror(errno.EACCES)) -> UserError:
    fix = "Make it readable (chmod u+rX) or stage something else"
    return UserError("--stage", f"cannot read {path}: {reason}", "", fix)


def check_source(path: str) -> os.stat_result:
    """Refuse a source that is not a folder or a regular file (or a symlink to one), or
    that the user cannot read, from os.lstat, os.stat and os.access alone: opening a
    FIFO blocks until a writer comes and /dev/zero never ends, so nothing is opened."""
    try:
        what = _special(path, os.lstat(path).st_mode)
        info = os.stat(path)
    except OSError as exc:
        raise _cannot_read(path, exc.strerror or str(exc)) from None
    if what:
        raise UserError(
            "--stage",
            f"{path} is {what}",
            "only folders and regular files can be staged",
            "Stage a folder or a regular file instead (write the data to a file first)",
        )
    if not os.access(path, os.R_OK | (os.X_OK if stat.S_ISDIR(info.st_mode) else 0)):
        raise _cannot_read(path)
    return info


def kind_of(path: str) -> str:
    if stat.S_ISDIR(check_source(path).st_mode):
        return DIRECTORY
    if path.endswith(ARCHIVES):
        return ARCHIVE
    try:
        # O_NONBLOCK: were the file swapped for a FIFO since check_source, the open
        # returns at once and fstat refuses it; a /proc file that claims to be regular
        # (kmsg) does not block the read either.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd).st_mode
            magic = os.read(fd, 4) if stat.S_ISREG(mode) else b""
        finally:
            os.close(fd)
    except OSError as exc:
        raise _cannot_read(path, exc.strerror or str(exc)) from None
    if not stat.S_ISREG(mode):
        check_source(path)  # refuses it, naming what it has become
        raise _cannot_read(path, "it changed while being read")
    return SQUASHFS if magic == SQUASHFS_MAGIC else FILE


def _refuse(root: str, special: list[str], unreadable: list[str]) -> None:
    """One line naming the first few special entries (else those the user cannot
    read), sorted, and how many more."""
    found = sorted(special or unreadable)
    if not found:
        return
    count, them = len(found), "it" if len(found) == 1 else "them"
    listed = ", ".join(found[:SHOWN]) + (f" and {count - SHOWN} more" if count > SHOWN else "")
    if special:
        raise UserError(
            "--stage",
            f"{root} holds {'a special file' if count == 1 else f'{count} special files'}: "
            f"{listed}",
            "a staged folder may hold only folders, regular files and symlinks to them",
            f"Remove {them} or stage the folder's regular files only",
        )
    raise UserError(
        "--stage",
        f"{root} holds {'an entry' if count == 1 else f'{count} entries'} you cannot read: "
        f"{listed}",
        "every file and folder of a staged folder must be readable by you",
        f"Make {them} readable (chmod u+rX) or remove {them}",
    )


def manifest(root: str) -> list[tuple[str, int, int, bool]]:
    """(relative path, size, mtime_ns, is_dir) of everything under root, sorted.

    Every listing of a staged tree (planning, hashing, packing) comes here, so here a
    tree holding a FIFO, device or socket (or a symlink to one) is refused and what the
    user cannot read is named: from entry types (lstat), os.stat of a symlink's target
    and os.access, never by opening a file."""
    check_source(root)
    out: list[tuple[str, int, int, bool]] = []
    special: list[str] = []
    unreadable: list[str] = []
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as entries:
            for entry in entries:
                path = f"{rel}/{entry.name}" if rel else entry.name
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed while listed: no longer part of the tree
                is_dir = stat.S_ISDIR(info.st_mode)
                what = _special(entry.path, info.st_mode)
                if what:
                    special.append(f"{entry.path} is {what}")
                elif stat.S_ISLNK(info.st_mode):
                    pass  # packed as a link (tar without -h): its target is not read
                # A folder needs x too: r alone lists its names but reaches nothing.
                elif not os.access(entry.path, os.R_OK | (os.X_OK if is_dir else 0)):
                    unreadable.append(entry.path + ("/" if is_dir else ""))
                elif is_dir:
                    stack.append(path)
                out.append((path, 0 if is_dir else info.st_size, info.st_mtime_ns, is_dir))
    _refuse(root, special, unreadable)
    out.sort()
    return out


def archive_size(path: str) -> int:
    """Bytes once unpacked: exact for .tar, gzip's own record for small .tar.gz, else
    the archive's size (a lower bound)."""
    size = os.path.getsize(path)
    if path.endswith((".tar.gz", ".tgz")) and size < 1 << 32:
        with open(path, "rb") as handle:
            handle.seek(-4, os.SEEK_END)
            return max(size, int.from_bytes(handle.read(4), "little"))
    return size


def _progress(
    total: int, path: Path, label: str, err: TextIO
) -> tuple[threading.Event, threading.Thread]:
    """Watch the growing tar and draw a progress bar on a terminal (a line otherwise)."""
    stop = threading.Event()

    def draw() -> None:
        if not err.isatty():
            err.write(f"hpclaunch: packing {label} ({human(total)}) once\n")
            return
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=Console(file=err),
            transient=True,
        ) as bar:
            task = bar.add_task(f"packing {label}", total=total)
            while not stop.wait(0.1):
                with contextlib.suppress(OSError):  # a part may vanish between list and stat
                    size = sum(f.stat().st_size for f in path.iterdir())
                    bar.update(task, completed=size)

    thread = threading.Thread(target=draw, daemon=True)
    thread.start()
    return stop, thread


def cache_key(src: str, items: list[tuple[str, int, int, bool]]) -> str:
    # PACK_FORMAT: packs made before their parts were read back (and links.tar) are
    # never reused; pruning removes them as the least recently used.
    import hashlib  # not on a held sweep's path (bench/sweep_submit.py)

    digest = hashlib.sha256(PACK_FORMAT + os.path.realpath(src).encode("utf-8", "surrogateescape"))
    for rel, size, mtime, is_dir in items:
        digest.update(f"{rel}\0{size}\0{mtime}\0{int(is_dir)}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:20]


def pack(src: str, folder: Path, items: list[tuple[str, int, int, bool]], err: TextIO) -> None:
    """Write the parts of a directory's pack (atomically: the folder appears complete or
    not at all), with a progress bar. Two runs packing the same tree at once both pack;
    the second to finish keeps the first one's pack (the same names, sizes and mtimes)."""
    from hpclaunch.payload import stagecache  # the pack cache: imported by runs that stage

    if folder.is_dir():
        stagecache.reuse(folder)  # unchanged since it was packed: the same files
        return
    stagecache.ensure(folder.parent)
    # Named before it is made, and made inside the try: a Ctrl-C (or SIGTERM/SIGHUP, which
    # hpclaunch turns into one) right after the folder appears still removes it (with
    # tempfile.mkdtemp before the try, one that came between the two left a partial pack).
    tmp = folder.parent / f".{folder.name}.{os.urandom(6).hex()}"
    progress: Optional[tuple[threading.Event, threading.Thread]] = None
    try:
        tmp.mkdir(mode=0o700)  # never an existing one (a random name, as mkdtemp's)
        total = sum(size for _, size, _, _ in items)
        progress = _progress(total + 512 * len(items), tmp, os.path.basename(src), err)
        started = time.monotonic()
        links = frozenset(
            r for r, _, _, d in items if not d and os.path.islink(os.path.join(src, r))
        )
        layout = split(items, links)
        for index, names in enumerate(layout):
            tar_part(src, tmp, PACK_PART % index, names)
        if links:
            tar_part(src, tmp, LINKS_PART, sorted(links))
        check_pack(src, tmp, layout, links)
        stagecache.write_source(tmp, src)
        try:
            os.replace(tmp, folder)
        except OSError as exc:
            # Another run packed the same tree meanwhile: its pack is complete (a rename
            # is atomic) and the same: reuse it, drop this one.
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not folder.is_dir():
                raise
            err.write(f"hpclaunch: {src} was packed by another run meanwhile: using {folder}\n")
            stagecache.reuse(folder)
            return
    finally:
        if progress is not None:
            progress[0].set()
            progress[1].join()
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    err.write(
        f"hpclaunch: packed {src}: {len(items)} entries, {human(total)} in "
        f"{time.monotonic() - started:.1f} s -> {folder}\n"
    )


def plan_stage(values: Iterable[str], cwd: Path, run_root: Path) -> tuple[StageItem, ...]:
    """Every --stage item with its size on a node and what each node unpacks (for a
    directory, the cached pack, a folder of tars: pack_all() writes it when missing)."""
    from hpclaunch.payload import stagecache  # the pack cache: imported by runs that stage

    items: list[StageItem] = []
    for text in values:
        src, name = parse(text, cwd)
        if any(i.name == name for i in items):
            raise UserError(
                "--stage", f"two sources are named {name}", "", "Name them: --stage SRC:NAME"
            )
        kind = kind_of(src)
        if kind == DIRECTORY:
            listing = manifest(src)
            stagecache.check_existing(run_root / CACHE)
            pack_dir = run_root / CACHE / f"{name}-{cache_key(src, listing)}"
            size = sum(size for _, size, _, _ in listing)
            items.append(StageItem(name, src, kind, str(pack_dir), size))
        elif kind == ARCHIVE:
            items.append(StageItem(name, src, kind, src, archive_size(src)))
        else:
            file = os.path.basename(src) if kind == FILE else ""
            items.append(StageItem(name, src, kind, src, os.path.getsize(src), file))
    return tuple(items)


def pack_all(
    items: tuple[StageItem, ...],
    err: TextIO = sys.stderr,
    limits: Optional[Limits] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> None:
    """Pack what is not packed yet, reuse the rest; with `limits`, then prune the cache
    (never these items' packs)."""
    from hpclaunch.payload import stagecache  # the pack cache: imported by runs that stage

    packed = [item for item in items if item.kind == DIRECTORY]
    for item in packed:
        if os.path.isdir(item.archive):
            stagecache.reuse(Path(item.archive))  # listing the tree again costs: not needed
        else:
            pack(item.src, Path(item.archive), manifest(item.src), err)
    if packed and limits is not None:
        cache = Path(packed[0].archive).parent
        stagecache.prune(cache, limits, [i.archive for i in packed], environ or {}, err)


def check_capacity(
    items: tuple[StageItem, ...], space_mb: Optional[int], ram_mb: Optional[int], where: str
) -> None:
    """Refuse before submission what cannot fit on a node (both numbers in the line)."""
    need = sum(i.size for i in items)
    need_mb = -(-need // 2**20)
    if space_mb and need_mb > space_mb:
        raise UserError(
            "--stage",
            f"{format_memory(need_mb)} to stage on every node",
            f"{where} have {format_memory(space_mb)} of node-local space",
            "Stage less (or a compressed archive), or use nodes with more space",
        )
    if ram_mb is not None and need_mb > ram_mb:
        raise UserError(
            "--stage",
            f"{format_memory(need_mb)} to stage into memory-backed /tmp",
            f"the job asks for {format_memory(ram_mb)} of memory per node",
            "Ask for more memory (--mem, --mem 0 for all of it) or stage less",
        )


def parse_stage_out(values: Iterable[str], cwd: Path) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for text in values:
        src, sep, dest = text.partition(":")
        if not sep or not src or not dest:
            raise UserError(
                "--stage-out", f"{show(text)} is not SRC:DEST", "", "Give e.g. out:results"
            )
        if os.path.isabs(src) or ".." in Path(src).parts:
            raise UserError(
                "--stage-out",
                f"{show(src)} leaves $HPCLAUNCH_LOCAL",
                "SRC is relative to the node-local folder",
                "Give a path inside it, e.g. out",
            )
        out.append((os.path.normpath(src), os.path.normpath(absolute(dest, cwd))))
    return tuple(out)
