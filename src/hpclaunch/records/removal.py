"""Deleting recorded runs and sweeps (`hpclaunch rm`, `hpclaunch gc`): which ones, and
the deletion itself: the folder (a sweep's holds its points) and its index line.

The states come from the caller (cli/removal_cmds.py brings them up to date in one
refresh); an open one (PENDING, RUNNING, ... , CREATED) is never deleted. A folder is
deleted only when it is a run or sweep folder of this user, neither it nor its
experiment folder is a symbolic link, and its real path lies in its run root: a link
planted by another user in a shared run root never leads the deletion elsewhere
(shutil.rmtree itself never follows the links inside).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from hpclaunch.errors import UserError, show
from hpclaunch.records import index, sweeprecord
from hpclaunch.records.runpaths import RECORD

_AGE = re.compile(r"(\d+)([smhdw]?)")
_UNIT_S = {"": 86400, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_ID_TIME = re.compile(r"(\d{8}-\d{6})-")


@dataclass(frozen=True)
class Doomed:
    """A run or a sweep to delete, as `rm` and `gc` list it."""

    run_id: str
    folder: Path
    is_sweep: bool
    state: str  # a run's state; a sweep's open state, else its points' counts ("2 FAILED")
    is_open: bool
    started: Optional[float]  # seconds since the epoch

    def line(self) -> str:
        kind = "sweep" if self.is_sweep else "run"
        return f"{kind} {self.run_id}  {self.state}  {self.folder}"

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "sweep": self.is_sweep,
            "state": self.state,
            "run_dir": str(self.folder),
        }


def parse_age(text: str) -> float:
    """--older-than: N followed by s, m, h, d (the default) or w -> seconds."""
    found = _AGE.fullmatch(text.strip().lower())
    if not found:
        raise UserError(
            "--older-than", f"{show(text)} is no age", "a number and s, m, h, d or w", "e.g. 30d"
        )
    return float(int(found.group(1)) * _UNIT_S[found.group(2)])


def started_at(entry: Mapping[str, Any]) -> Optional[float]:
    """When a run or sweep started: its index line's submitted_at, else its id's time."""
    value = entry.get("submitted_at")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    found = _ID_TIME.match(str(entry.get("run_id", "")))
    if not found:
        return None
    when = datetime.strptime(found.group(1), "%Y%m%d-%H%M%S").replace(tzinfo=timezone.utc)
    return when.timestamp()


def collectable(
    found: Sequence[Doomed],
    older_than_s: float,
    wanted_state: Optional[str],
    now: Optional[float] = None,
) -> list[Doomed]:
    """`gc`'s choice: ended, started more than `older_than_s` ago (an unknown start is
    never old), and in `wanted_state` (a sweep: when one of its points is, as `runs
    --state` lists it)."""
    limit = (time.time() if now is None else now) - older_than_s
    chosen = []
    for item in found:
        if item.is_open or item.started is None or item.started > limit:
            continue
        if wanted_state and wanted_state not in _states_of(item):
            continue
        chosen.append(item)
    return chosen


def _states_of(item: Doomed) -> set[str]:
    if not item.is_sweep:
        return {item.state}
    return {part.split()[-1] for part in item.state.split(", ") if part}


def refuse_open(found: Sequence[Doomed]) -> None:
    """`rm` of an open run or sweep: one line, nothing deleted."""
    for item in found:
        if item.is_open:
            kind = "sweep" if item.is_sweep else "run"
            raise UserError(
                "RUN",
                f"{kind} {item.run_id} is {item.state}",
                "an active run is never deleted",
                f"Wait for it to end or cancel it first: hpclaunch cancel {item.run_id}",
            )


def delete(found: Sequence[Doomed], environ: Mapping[str, str]) -> tuple[list[Doomed], list[str]]:
    """Delete these folders, then their index lines (a run whose folder could not be
    deleted keeps its line). Returns what was deleted and a line per folder kept."""
    problems: list[str] = []
    deleted: list[Doomed] = []
    for item in found:
        why = _unsafe(item.folder)
        if why is None:
            why = _remove_tree(item.folder)
        if why is None:
            deleted.append(item)
        else:
            problems.append(f"{item.folder}: {why}; kept")
    if deleted:
        index.drop({item.run_id for item in deleted}, environ)
    return deleted, problems


def _unsafe(folder: Path) -> Optional[str]:
    """Why `folder` must not be deleted (None: it may)."""
    try:
        info = os.lstat(folder)
        experiment = os.lstat(folder.parent)
    except OSError as exc:
        return f"not readable ({exc.strerror})"
    if stat.S_ISLNK(info.st_mode) or stat.S_ISLNK(experiment.st_mode):
        return "a symbolic link, not a run folder"
    if not stat.S_ISDIR(info.st_mode):
        return "not a folder"
    if info.st_uid != os.getuid():
        return "another user's folder"
    root = os.path.realpath(folder.parent.parent)
    if os.path.realpath(folder) != os.path.join(root, folder.parent.name, folder.name):
        return "its path leads out of its run root"
    if not (folder / RECORD).is_file() and not sweeprecord.is_sweep(folder):
        return "holds no run.json or sweep.json"
    return None


def _remove_tree(folder: Path) -> Optional[str]:
    """rmtree, which never follows the links inside (avoids_symlink_attacks). From
    Python 3.11 it starts from the experiment folder opened without following a link and
    checked to be the one _unsafe saw, so that one swapped for a link in between is not
    followed either."""
    failures: list[str] = []

    def failed(_func: Any, path: str, exc_info: Any) -> None:
        failures.append(f"{path}: {getattr(exc_info[1], 'strerror', None) or exc_info[1]}")

    if sys.version_info < (3, 11):
        shutil.rmtree(folder, onerror=failed)
    else:
        try:
            parent = os.open(folder.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            return f"its experiment folder cannot be opened ({exc.strerror})"
        try:
            seen, now = os.lstat(folder.parent), os.fstat(parent)
            if (seen.st_dev, seen.st_ino) != (now.st_dev, now.st_ino):
                return "its experiment folder changed while deleting"
            shutil.rmtree(folder.name, dir_fd=parent, onerror=failed)
        finally:
            os.close(parent)
    if failures:
        return f"{len(failures)} entries could not be removed ({failures[0]})"
    return None
