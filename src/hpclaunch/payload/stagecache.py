"""The stage cache (<run-root>/.stage-cache/): a folder of packs, each <NAME>-<key>/ with
its parts and `.source` (the folder it packs). Used only when it is the user's and
nobody else can write it; pruned after each packing run (the `stage_cache_keep` most
recently used packs per source, at most `stage_cache_max` in all, least recently used
first), never a pack a queued or running job uses; `hpclaunch clean --stage-cache`
empties it.

A pack's "last used" time is its folder's mtime: set when it is packed, reused, or
unpacked by a node's stage guard.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, TextIO

from hpclaunch.errors import UserError
from hpclaunch.payload.snapshot import human
from hpclaunch.payload.stagepack import is_part

if TYPE_CHECKING:
    from hpclaunch.config.profiles import Profile

SOURCE = ".source"  # in a pack: the absolute path of the folder it packs
DEFAULT_KEEP = 2
DEFAULT_MAX_BYTES = 200 * 2**30
# A pack used this recently may belong to a run being started (packed or reused, not yet
# in squeue) or a local run unpacking it: never pruned; `clean --stage-cache`, asked for
# by the user, keeps only those of the last minute (a run starting now).
RECENT_S = 600.0
CLEAN_RECENT_S = 60.0
ABANDONED_S = 86400.0  # a hidden pack folder untouched this long: its packer was killed


@dataclass(frozen=True)
class Limits:
    keep: int = DEFAULT_KEEP  # packs per source
    max_bytes: int = DEFAULT_MAX_BYTES  # all packs together


@dataclass(frozen=True)
class Pack:
    path: str
    source: str
    used: float  # last used: the folder's mtime
    size: int


def limits(profile: Profile) -> Limits:
    """The profile's stage_cache_keep and stage_cache_max (a size: 200G, 500M)."""
    from hpclaunch.basics.units import parse_memory

    max_mb = parse_memory(profile.stage_cache_max, "stage_cache_max")
    return Limits(max(0, profile.stage_cache_keep), max_mb * 2**20)


def check_private(path: Path) -> None:
    """Refuse a cache folder (or a pack in it) that another user owns or can write:
    they could swap the parts every node unpacks."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise UserError("--stage", f"cannot use the pack cache {path}: {exc.strerror}", "",
                        "Check the run root's permissions") from None  # fmt: skip
    why = ""
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        why = "not a folder (a symlink or a file)"
    elif info.st_uid != os.getuid():
        why = f"owned by uid {info.st_uid}, not you (uid {os.getuid()})"
    elif info.st_mode & 0o022:
        who = "group" if info.st_mode & 0o020 else "others"
        why = f"writable by {who} (mode {info.st_mode & 0o7777:o})"
    if why:
        raise UserError(
            "--stage",
            f"the pack cache {path} is {why}",
            "it must be your folder, writable only by you",
            f"Remove it (rm -r {path}) or fix it (chmod go-w {path}); hpclaunch makes it afresh",
        )


def ensure(cache: Path) -> None:
    """The cache folder, made 0700 when missing, checked either way."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(cache, 0o700)
    check_private(cache)


def check_existing(cache: Path) -> None:
    """At planning (a dry-run too): refuse a cache that is there and not private."""
    if os.path.lexists(cache):
        check_private(cache)


def reuse(folder: Path) -> None:
    """A pack about to be used again: both it and the cache checked, its time renewed."""
    check_private(folder.parent)
    check_private(folder)
    os.utime(folder)


def write_source(pack: Path, src: str) -> None:
    (pack / SOURCE).write_text(os.path.realpath(src), encoding="utf-8", errors="surrogateescape")


def packs(cache: Path) -> list[Pack]:
    """The complete packs in the cache (a pack being written is a hidden folder)."""
    found: list[Pack] = []
    try:
        entries = list(os.scandir(cache))
    except FileNotFoundError:
        return found
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            with os.scandir(entry.path) as inside:
                parts = [p.stat(follow_symlinks=False).st_size for p in inside if is_part(p.name)]
            size = sum(parts)
            used = entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue  # removed meanwhile (another run pruning at the same time)
        try:
            source = Path(entry.path, SOURCE).read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            source = entry.name.rpartition("-")[0]  # packed before .source: its NAME
        found.append(Pack(entry.path, source, used, size))
    return found


def in_use(environ: Mapping[str, str]) -> Optional[set[str]]:
    """The packs the user's queued and running jobs use, from ONE squeue call (each job's
    batch script lies in its run or sweep folder, whose spec.json lists its staged items);
    None when squeue cannot answer. Without Slurm here, no job can use one."""
    from hpclaunch.basics.users import user_name
    from hpclaunch.slurm import commands

    if shutil.which("squeue") is None:
        return set()
    out = commands.query(["squeue", "-h", "-u", user_name(environ), "-o", "%o"], timeout=30)
    if out is None:
        return None
    used: set[str] = set()
    for command in set(out.splitlines()):
        for item in _staged(command.strip()):
            if isinstance(item, dict) and isinstance(item.get("archive"), str):
                used.add(os.path.normpath(item["archive"]))
    return used


def _staged(command: str) -> list[object]:
    """The staged items of the run or sweep whose batch script `command` runs (squeue's
    %o: the script's path, then any arguments, as --chain gives one): [] for a job
    hpclaunch did not submit, or whose folder is gone."""
    words = command.split(" ")
    for end in range(len(words), 0, -1):  # the longest prefix that names a script
        script = " ".join(words[:end])
        if os.path.isabs(script) and os.path.isfile(script):
            try:
                spec = json.loads(Path(os.path.dirname(script), "spec.json").read_text())
                return list(spec.get("stage") or [])
            except (OSError, ValueError, AttributeError):
                return []
    return []


def choose(
    found: list[Pack],
    limits: Limits,
    keep: Iterable[str],
    busy: set[str],
    now: float,
    recent_s: float = RECENT_S,
) -> list[Pack]:
    """The packs to remove: beyond the `keep` most recently used of each source, then the
    least recently used until all fit `max_bytes`; never one in `keep`, `busy`, or used
    in the last `recent_s` seconds."""
    kept = {os.path.normpath(p) for p in keep} | busy

    def protected(pack: Pack) -> bool:
        return os.path.normpath(pack.path) in kept or now - pack.used < recent_s

    doomed: list[Pack] = []
    by_source: dict[str, list[Pack]] = {}
    for pack in found:
        by_source.setdefault(pack.source, []).append(pack)
    for group in by_source.values():
        group.sort(key=lambda p: p.used, reverse=True)
        doomed += [p for p in group[max(0, limits.keep) :] if not protected(p)]
    total = sum(p.size for p in found if p not in doomed)
    for pack in sorted((p for p in found if p not in doomed), key=lambda p: p.used):
        if total <= limits.max_bytes:
            break
        if not protected(pack):
            doomed.append(pack)
            total -= pack.size
    return doomed


def prune(cache: Path, limits: Limits, keep: Iterable[str], environ: Mapping[str, str],
          err: TextIO) -> list[Pack]:  # fmt: skip
    """Remove what choose() picks; squeue is asked once, and only when something would
    go. Returns what was removed."""
    found, now, keep = packs(cache), time.time(), list(keep)
    if not choose(found, limits, keep, set(), now):
        return []
    busy = in_use(environ)
    if busy is None:
        err.write(f"hpclaunch: squeue does not answer: the stage cache {cache} is not pruned\n")
        return []
    doomed = choose(found, limits, keep, busy, now)
    for pack in doomed:
        shutil.rmtree(pack.path, ignore_errors=True)
    if doomed:
        err.write(
            f"hpclaunch: stage cache: removed {len(doomed)} older pack(s), "
            f"{human(sum(p.size for p in doomed))} (stage_cache_keep {limits.keep}, "
            f"stage_cache_max {human(limits.max_bytes)})\n"
        )
    return doomed


def empty(
    cache: Path, environ: Mapping[str, str], dry_run: bool
) -> Optional[tuple[list[Pack], list[Pack]]]:
    """`clean --stage-cache`: (removed, kept in use) of every pack, or None when squeue
    cannot tell which packs jobs use (then nothing is removed). Half-written packs of a
    packer that was killed (hidden folders untouched for a day) go too."""
    found = packs(cache)
    busy = in_use(environ) if found else set()
    if busy is None:
        return None
    now = time.time()
    everything = Limits(keep=0, max_bytes=-1)
    doomed = choose(found, everything, (), busy, now, CLEAN_RECENT_S) + _abandoned(cache, now)
    if not dry_run:
        for pack in doomed:
            shutil.rmtree(pack.path, ignore_errors=True)
    return doomed, [p for p in found if p not in doomed]


def _abandoned(cache: Path, now: float) -> list[Pack]:
    """The hidden `.NAME-key.*` folders a packer writes into, untouched for a day: its
    process was killed (any other end removes them)."""
    found: list[Pack] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(cache) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if entry.name.startswith(".") and stat.S_ISDIR(info.st_mode) and \
                        now - info.st_mtime > ABANDONED_S:  # fmt: skip
                    found.append(Pack(entry.path, "", info.st_mtime, 0))
    return found
