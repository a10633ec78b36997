"""The per-user run index: one JSON line per run, so that `runs`, `status`, `logs` and
`cancel` find runs from any directory (refs.py reads what a user types against it).

Appends are one write() on an O_APPEND descriptor, under the folder's lock
(records/locking.py) that `drop` (rm, gc) rewrites the index under, so no run loses
its line; one cut short by a full disk is taken back. A damaged or foreign line
(cut short, invalid UTF-8, missing fields, another version's shape) is skipped with a
warning; it never stops a listing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from hpclaunch.basics import filemodes
from hpclaunch.records import locking

Warn = Callable[[str], None]
PROJECT = "project"  # an index line's key: the project the run was started from
#: Where a laptop's hpclaunch says, over --remote, which shipped project a command is for.
#: Not HPCLAUNCH_PROJECT, the project's name every job's ranks get (docs/contract.md): an
#: hpclaunch command inside a job took that name for a folder and found no `last`.
PROJECT_VARIABLE = "HPCLAUNCH_SHIPPED_PROJECT"
ANY_PROJECT = "*"  # its value for a laptop folder with no project: `last` is anyone's


def path(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_DATA_HOME") or str(_home(environ) / ".local" / "share")
    return Path(base) / "hpclaunch" / "runs.jsonl"


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ["HOME"]) if environ.get("HOME") else Path.home()


def project_of(cwd: Path, environ: Mapping[str, str]) -> str:
    """The project a run started here belongs to (`last` is its newest run): the shipped
    project's folder over --remote ($HPCLAUNCH_SHIPPED_PROJECT), else the git work tree's top
    holding cwd, else cwd itself."""
    shipped = environ.get(PROJECT_VARIABLE)
    if shipped == ANY_PROJECT:
        return ANY_PROJECT
    if shipped:  # "~/..." under this environment's home (the request's, over --remote)
        home_relative = shipped.startswith("~/")
        return str(_home(environ) / shipped[2:] if home_relative else Path(shipped).absolute())
    here = cwd.absolute()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return str(folder)
    return str(here)


def entry_project(entry: dict[str, Any], environ: Mapping[str, str]) -> Optional[str]:
    """An index line's project; a line written before projects were recorded has it
    from its record's working folder (run.json or sweep.json), None when that is gone."""
    if isinstance(entry.get(PROJECT), str):
        return str(entry[PROJECT])
    folder = Path(entry["run_dir"])
    for name in ("run.json", "sweep.json"):
        try:
            cwd = json.loads((folder / name).read_text(encoding="utf-8")).get("cwd")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(cwd, str) and cwd:
            return project_of(Path(cwd), {})
    return None


def add(entry: dict[str, Any], environ: Mapping[str, str], cwd: Optional[Path] = None) -> None:
    """Append a run's line, its project recorded (from cwd, else here) unless given."""
    if PROJECT not in entry:
        entry = {**entry, PROJECT: project_of(cwd or Path.cwd(), environ)}
    target = path(environ)
    filemodes.make_dirs(target.parent, "private")  # the user's own list of runs: never shared
    line = (json.dumps(entry, sort_keys=True) + "\n").encode("utf-8")
    with locking.exclusive(target.parent):  # never between drop()'s read and its rename
        fd = filemodes.open_new(target, os.O_WRONLY | os.O_APPEND, "private")
        try:
            _append(fd, line)
        finally:
            os.close(fd)


def _append(fd: int, line: bytes) -> None:
    """One write() of the whole line. A full disk (or quota) cuts it short: the cut
    line is taken back, so that the next run's line does not continue it (both would
    be one damaged line), and OSError(ENOSPC) says the run is not indexed."""
    written = os.write(fd, line)  # OSError: nothing was written
    if written == len(line):
        return
    end = os.lseek(fd, 0, os.SEEK_CUR)  # O_APPEND: just after the bytes written
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_size == end:
            os.ftruncate(fd, end - written)
        else:  # another run appended after the cut line: end it instead (skipped on read)
            os.write(fd, b"\n")
    raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (the index line was cut short)")


@dataclass
class Listing:
    entries: list[dict[str, Any]]  # newest first; the last line for a run id wins
    skipped: list[str] = field(default_factory=list)  # why lines were ignored


def read(environ: Mapping[str, str]) -> Listing:
    source = path(environ)
    try:
        data = source.read_bytes()
    except FileNotFoundError:
        return Listing([])
    except OSError as exc:
        return Listing([], [f"{source}: unreadable ({exc.strerror}); no runs listed"])
    by_id: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    for number, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        entry = _entry(raw)
        if entry is None:
            skipped.append(f"{source}:{number}: not a run entry, skipped")
            continue
        by_id[entry["run_id"]] = entry
    entries = sorted(by_id.values(), key=lambda e: e["run_id"], reverse=True)
    return Listing(entries, skipped)


def _entry(raw: bytes) -> Optional[dict[str, Any]]:
    try:
        entry = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(entry, dict):
        return None
    if not isinstance(entry.get("run_id"), str) or not isinstance(entry.get("run_dir"), str):
        return None
    if entry.get("job_id") is not None:
        entry["job_id"] = str(entry["job_id"])
    return entry


def live(environ: Mapping[str, str], warn: Optional[Warn] = None) -> list[dict[str, Any]]:
    """Entries whose run folder still exists, newest first."""
    listing = read(environ)
    if warn is not None:
        for line in listing.skipped[:3]:
            warn(line)
        if len(listing.skipped) > 3:
            warn(f"... and {len(listing.skipped) - 3} more damaged index lines")
    return [e for e in listing.entries if Path(e["run_dir"]).is_dir()]


def drop(run_ids: Collection[str], environ: Mapping[str, str]) -> int:
    """Remove every line of these runs (`rm`, `gc`): the index rewritten atomically under
    its folder's lock, which `add` takes too, so that no run started meanwhile loses its
    line. Damaged lines are kept (invalid UTF-8 as U+FFFD: still skipped by `read`).
    Returns how many lines were dropped."""
    target = path(environ)
    with locking.exclusive(target.parent):
        try:
            data = target.read_bytes()
        except FileNotFoundError:
            return 0
        kept: list[bytes] = []
        for raw in data.splitlines(keepends=True):
            entry = _entry(raw) if raw.strip() else None
            if entry is None or entry["run_id"] not in run_ids:
                kept.append(raw if raw.endswith(b"\n") else raw + b"\n")
        dropped = len(data.splitlines(keepends=True)) - len(kept)
        if dropped:
            filemodes.write_atomic(target, b"".join(kept).decode("utf-8", "replace"))
    return dropped
