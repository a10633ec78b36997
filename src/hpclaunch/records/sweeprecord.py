"""The sweep folder on disk: sweep.json (the sweep record) and one run folder per point.

<run-root>/<exp>/<sweep-id>/
    sweep.json        options, the point table, the arrays submitted (host-written)
    job.sh            the array's batch script (one per sweep; a point = offset + task id)
    bootstrap.py ...  the shipped files, one copy for every point
    code/             the one code snapshot every point runs
    logs/             what Slurm writes before a point has its folder (%A_%a.out)
    points/<i>/       a complete run folder: run.json, job.sh, params.env, logs/,
                      checkpoints/, result.json, events.jsonl, attempts/<n>/ (earlier tries);
                      run.json only once the point's record first changes: until then
                      it is made from sweep.json (records/pointrecords.py)

Only the host writes sweep.json and the points' run.json (under the folder's lock, as
records/runrecord.py does); the job appends point_start/point_end to a point's events.jsonl and,
for Optuna, writes params.env/params.json when it asks for its trial.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from hpclaunch.basics import filemodes
from hpclaunch.errors import HpclaunchError
from hpclaunch.node import EVENTS, RESULT_JSON
from hpclaunch.records import pointrecords, runrecord
from hpclaunch.records.runpaths import CANCELLED_FILE

SWEEP_JSON = pointrecords.SWEEP_JSON
POINTS = pointrecords.POINTS
PARAMS_ENV = "params.env"  # an Optuna point's, sourced by the array script before job.sh
PARAMS_SH = "params.sh"  # line i+1: point i's exports (grid, W&B), read by its array task
POINT_SH = "point.sh"  # every point's job.sh, a token where its number goes
PARAMS_JSON = "params.json"  # an Optuna point's parameters, written when it asks
ATTEMPTS = "attempts"
POINT_START, POINT_END = runrecord.JOB_START, runrecord.JOB_END  # appended by the array script

# sweep.json's key: an ended sweep's counts, exit code and arrays, kept by `runs`
# (cli/records_cmds) so that listings read no point of it again; a retry clears it.
ENDED_TALLY = "ended_tally"


class DamagedSweep(HpclaunchError):
    """sweep.json exists but is not a sweep record."""


def is_sweep(folder: Path) -> bool:
    return (folder / SWEEP_JSON).is_file()


def point_dir(sweep_dir: Path, index: int) -> Path:
    return sweep_dir / POINTS / str(index)


def load(sweep_dir: Path) -> dict[str, Any]:
    path = sweep_dir / SWEEP_JSON
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise DamagedSweep(
            f"{path}: unreadable sweep record ({type(exc).__name__}). Remove the sweep "
            "folder or restore the file"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("points"), list):
        raise DamagedSweep(f"{path}: not a sweep record. Remove the sweep folder")
    return data


def write(sweep_dir: Path, data: Mapping[str, Any]) -> None:
    """sweep.json, atomically (write aside, fsync, rename: the sweep's commit point). One
    key a line, each value on one line: json's C encoder (indent= falls back to the pure
    Python one, a tenth of a held 1,000-point submission for the point table, twice)."""
    keys = sorted(data)
    body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(data[k], sort_keys=True)}" for k in keys)
    text = "{\n" + body + "\n}\n" if keys else "{}\n"
    filemodes.write_atomic(sweep_dir / SWEEP_JSON, text)


def update(sweep_dir: Path, **changes: Any) -> dict[str, Any]:
    """Change some keys of sweep.json under the sweep folder's lock."""
    with runrecord._locked(sweep_dir):
        data = load(sweep_dir)
        data.update(changes)
        write(sweep_dir, data)
    return data


def write_new(path: str | os.PathLike[str], text: str) -> None:
    """A file in a folder made moments ago that nobody reads yet: no rename, no fsync
    (a sweep writes thousands of them; sweep.json, written last, is the commit point).
    A plain string path is fine: a Path per file was a tenth of a 1,000-point sweep."""
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as fh:
        fh.write(text)


def point_end(folder: Path, job: str) -> Optional[dict[str, Any]]:
    """The point_end event of the attempt that ran as array task `job` ("123_4")."""
    return runrecord.job_event(folder, POINT_END, job)


def point_started(folder: Path, job: str) -> Optional[dict[str, Any]]:
    return runrecord.job_event(folder, POINT_START, job)


def result(folder: Path) -> Optional[dict[str, Any]]:
    """Rank 0's result.json (a JSON object), or None when absent or not an object."""
    try:
        data = json.loads((folder / RESULT_JSON).read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def params_of(folder: Path, planned: Mapping[str, Any]) -> dict[str, Any]:
    """A point's parameters: those an Optuna point asked for, else the planned ones."""
    try:
        data = json.loads((folder / PARAMS_JSON).read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return dict(planned)
    return data if isinstance(data, dict) else dict(planned)


def keep_attempt(folder: Path, attempt: int) -> None:
    """Before a retry: the last attempt's logs, events and result move to attempts/<n>/,
    so the new attempt starts clean and nothing of the old one is lost. Checkpoints stay
    (a retried point may resume from them)."""
    pointrecords.make_folder(folder)  # a point whose task never started has none
    keep = folder / ATTEMPTS / str(attempt)
    keep.mkdir(parents=True, exist_ok=True)
    # A cancel asked of the last attempt (`cancel SWEEP:I`) is kept with it, not this one's.
    for name in ("logs", EVENTS, RESULT_JSON, PARAMS_JSON, CANCELLED_FILE):
        source = folder / name
        if source.exists():
            os.replace(source, keep / name)
    (folder / "logs").mkdir(exist_ok=True)
