"""A sweep point's run record before its run.json exists: made from sweep.json.

A 1,000-point sweep used to write 1,000 run.json files at submission, a third of the time
from the command to its printed sweep id. Their contents differ only in a few keys, all of
which sweep.json holds once anyway: so the submission writes the common record once
(sweep.json's POINT_RECORD: the first point's record with TOKEN where the point's number
goes) and each point's job id and command in its row of the point table. A point's
run.json is written the first time something changes it (runrecord.update, under the
point folder's lock, starts from what this module makes), and from then on it is read as
any run's.

Only records/ reads this; standard library only, so records/runrecord.py can call it for
every run.json it does not find.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

SWEEP_JSON = "sweep.json"  # records/sweeprecord.py's names, which import this module's
POINTS = "points"
POINT_RECORD = "point_record"  # sweep.json's key: {"token": ..., "base": {...}}
TOKEN_KEYS = ("run_id", "run_dir", "checkpoint_dir")  # the keys that hold the number

# sweep.json parsed, and its common record as JSON text (each point's record is a fresh
# copy of it, shared with no caller), by the file's identity: `sweep status` of 1,000
# points, reading each point's record, parses the sweep's record once, not 1,000 times.
_cache: dict[tuple[str, int, int, int], tuple[dict[str, Any], str]] = {}


def from_sweep(point_dir: Path) -> Optional[dict[str, Any]]:
    """The run record of the point whose folder is `point_dir`, from its sweep's
    sweep.json; None when the folder is no point of a sweep that records points so
    (a plain run folder, or a sweep written before this module)."""
    if point_dir.parent.name != POINTS or not point_dir.name.isdigit():
        return None
    loaded = _load(point_dir.parent.parent / SWEEP_JSON)
    if loaded is None:
        return None
    sweep, base_text = loaded
    index = int(point_dir.name)
    row = _row(sweep, index)
    if row is None:
        return None
    token, number = str(sweep[POINT_RECORD].get("token")), str(index)
    record: dict[str, Any] = json.loads(base_text)
    for key in TOKEN_KEYS:
        if isinstance(record.get(key), str):
            record[key] = record[key].replace(token, number)
    job = row.get("job")
    record.update(
        point=index,
        job_id=job,
        job_ids=[job] if job else [],
        command=list(row.get("command") or []),
        params=dict(row.get("params") or {}),
    )
    return record


def make_folder(point_dir: Path) -> None:
    """A sweep point's folder, made where a host-side writer needs it before the point's
    array task has made it (a held sweep makes no point folder at submission: its task
    does when it starts, sweeps/script.array_script). The same mode as the sweep's
    points/ folder (the run's share), whatever the umask. Anything else: left alone."""
    if point_dir.parent.name != POINTS or not point_dir.name.isdigit():
        return
    if not os.path.isfile(point_dir.parent.parent / SWEEP_JSON):
        return
    try:
        mode = os.stat(point_dir.parent).st_mode & 0o7777
        os.mkdir(point_dir, mode)
    except (FileExistsError, FileNotFoundError):
        return  # there already (the task made it), or no sweep there: nothing to make
    os.chmod(point_dir, mode)  # the umask may have narrowed it


def _row(sweep: dict[str, Any], index: int) -> Optional[dict[str, Any]]:
    """The point table's row of point `index` (rows are by index; a retry keeps them)."""
    rows = sweep.get("points")
    if not isinstance(rows, list):
        return None
    at: Any = rows[index] if index < len(rows) else None
    if isinstance(at, dict) and at.get("index") == index:
        return at
    found: Optional[dict[str, Any]] = next(
        (r for r in rows if isinstance(r, dict) and r.get("index") == index), None
    )
    return found


def _load(path: Path) -> Optional[tuple[dict[str, Any], str]]:
    """sweep.json parsed and its common point record as text; None when absent, not a
    JSON object or without POINT_RECORD. Cached by the file's identity (inode, size,
    modification time): sweep.json is only ever replaced whole (a rename), so a rewrite is
    a new inode and is seen at once."""
    try:
        with open(path, "rb") as handle:
            st = os.fstat(handle.fileno())
            key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
            found = _cache.get(key)
            if found is not None:
                return found
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    common = data.get(POINT_RECORD) if isinstance(data, dict) else None
    if not isinstance(common, dict) or not isinstance(common.get("base"), dict):
        return None
    _cache.clear()  # one sweep at a time is what readers walk
    _cache[key] = found = (data, json.dumps(common["base"]))
    return found
