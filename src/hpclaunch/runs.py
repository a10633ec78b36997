"""Run directories, run records and the per-user run index.

<root>/<exp>/<run-id>/ holds run.json (the record), spec.json, job.sh, bootstrap.py,
logs/ and checkpoints/ (docs/internals.md). The index in the user's data folder lets
`hpclaunch runs/status/logs/cancel` find runs from any directory.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from .errors import UserError, show

RECORD = "run.json"


@dataclass(frozen=True)
class RunPaths:
    run_id: str
    run_dir: Path
    checkpoint_dir: Path

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def job_sh(self) -> Path:
        return self.run_dir / "job.sh"

    @property
    def bootstrap(self) -> Path:
        return self.run_dir / "bootstrap.py"

    @property
    def record(self) -> Path:
        return self.run_dir / RECORD


def new_run_id(now: Optional[float] = None) -> str:
    """Sortable by time (UTC, ms) and unique: 4 random hex digits + exclusive mkdir."""
    stamp = time.time() if now is None else now
    when = datetime.fromtimestamp(stamp, tz=timezone.utc)
    return f"{when:%Y%m%d-%H%M%S}-{int(stamp * 1000) % 1000:03d}-{secrets.token_hex(2)}"


def absolute(path: str, cwd: Path) -> Path:
    """A configured folder ($VARS and ~ expanded, relative to cwd)."""
    full = Path(os.path.expandvars(path)).expanduser()
    return full if full.is_absolute() else cwd / full


def plan_paths(run_root: str, exp: str, checkpoint_root: str, cwd: Path) -> RunPaths:
    """Paths for a new run, not yet created (what --dry-run shows)."""
    run_id = new_run_id()
    run_dir = absolute(run_root, cwd) / exp / run_id
    ckpt = (
        absolute(checkpoint_root, cwd) / exp / run_id / "checkpoints"
        if checkpoint_root
        else run_dir / "checkpoints"
    )
    return RunPaths(run_id=run_id, run_dir=run_dir, checkpoint_dir=ckpt)


def create(paths: RunPaths) -> RunPaths:
    """Make the run directory; a colliding id (same ms, same random) gets a new one."""
    for _ in range(20):
        try:
            paths.run_dir.parent.mkdir(parents=True, exist_ok=True)
            paths.run_dir.mkdir()
            break
        except FileExistsError:
            run_id = new_run_id()
            paths = RunPaths(
                run_id=run_id,
                run_dir=paths.run_dir.parent / run_id,
                checkpoint_dir=Path(str(paths.checkpoint_dir).replace(paths.run_id, run_id)),
            )
        except OSError as exc:
            raise UserError(
                "--run-root",
                f"cannot create {paths.run_dir}: {exc.strerror}",
                "",
                "Pick a folder you can write with --run-root",
            ) from None
    paths.logs.mkdir()
    paths.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    return paths


def remove(paths: RunPaths) -> None:
    """Undo create() when a submission fails: nothing is left behind."""
    shutil.rmtree(paths.run_dir, ignore_errors=True)
    if paths.run_dir not in paths.checkpoint_dir.parents:
        shutil.rmtree(paths.checkpoint_dir.parent, ignore_errors=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_record(run_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((run_dir / RECORD).read_text(encoding="utf-8"))
        return data
    except (OSError, ValueError):
        return {}


def update_record(run_dir: Path, **changes: Any) -> dict[str, Any]:
    record = read_record(run_dir)
    record.update(changes)
    write_json(run_dir / RECORD, record)
    return record


# ---- the per-user index -------------------------------------------------------------


def index_path() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "hpclaunch" / "runs.jsonl"


def add_to_index(entry: dict[str, Any]) -> None:
    path = index_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(entry, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write on an O_APPEND fd: concurrent runs never interleave
    finally:
        os.close(fd)


def index_entries() -> list[dict[str, Any]]:
    """Newest first; the last line for a run id wins (an entry may be re-added)."""
    path = index_path()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    by_id: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and "run_id" in entry:
            by_id[entry["run_id"]] = entry
    return sorted(by_id.values(), key=lambda e: str(e["run_id"]), reverse=True)


def iter_live(entries: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for entry in entries:
        if Path(entry.get("run_dir", "")).is_dir():
            yield entry


def find(ref: str) -> dict[str, Any]:
    """RUN = a run id, a unique prefix of one, a Slurm job id, or `last`."""
    entries = list(iter_live(index_entries()))
    if not entries:
        raise UserError(
            "RUN", f"no runs recorded yet ({show(ref)})", "", "Start one with hpclaunch run"
        )
    if ref == "last":
        return entries[0]
    exact = [e for e in entries if e["run_id"] == ref or str(e.get("job_id", "")) == ref]
    if exact:
        return exact[0]
    matches = [e for e in entries if str(e["run_id"]).startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UserError(
            "RUN",
            f"no run matches {show(ref)}",
            "a run id, a unique prefix, a job id or last",
            "See hpclaunch runs",
        )
    raise UserError(
        "RUN",
        f"{show(ref)} matches {len(matches)} runs",
        "the prefix must be unique",
        f"Type more of it, e.g. {matches[0]['run_id']}",
    )
