"""Run folders: where a run lives and how its folder is made and undone.

<root>/<exp>/<run-id>/ holds run.json (the record, records/runrecord.py), events.jsonl (what the
job's own code reports), spec.json, job.sh, bootstrap.py, logs/ and checkpoints/
(docs/internals.md).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from hpclaunch.basics import filemodes
from hpclaunch.errors import UserError
from hpclaunch.node import EVENTS, LOADER, RUN_DIR_NAME

RECORD = "run.json"


@dataclass(frozen=True)
class RunPaths:
    run_id: str
    run_dir: Path
    checkpoint_dir: Path
    # Where the shipped files (bootstrap, stage guard) lie: the run folder, or for the
    # points of a sweep the sweep folder (one copy for all of them).
    shipped_dir: Optional[Path] = None

    def shipped(self, name: str) -> Path:
        """A shipped file (node.BOOTSTRAP, node.STAGE_GUARD, ...) as the job sees it."""
        return (self.shipped_dir or self.run_dir) / RUN_DIR_NAME[name]

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def job_sh(self) -> Path:
        return self.run_dir / "job.sh"

    @property
    def bootstrap(self) -> Path:
        return self.shipped(LOADER)

    @property
    def record(self) -> Path:
        return self.run_dir / RECORD

    @property
    def events(self) -> Path:
        return self.run_dir / EVENTS


CANCELLED_FILE = "cancelled"  # in the run folder: `hpclaunch cancel` asked for the end
ATTEMPT_PREFIX = "attempt-"  # logs/attempt-N/: the ranks' logs of attempt N (--requeue)


def attempt_numbers(run_dir: Path) -> list[int]:
    """The attempts that have a log folder, in order ([] for a run without --requeue)."""
    try:
        names = os.listdir(run_dir / "logs")
    except OSError:
        return []
    found = []
    for name in names:
        digits = name[len(ATTEMPT_PREFIX) :]
        if name.startswith(ATTEMPT_PREFIX) and digits.isdigit():
            found.append(int(digits))
    return sorted(found)


def rank_logs(run_dir: Path, attempt: Optional[int] = None) -> Path:
    """The folder of the ranks' logs: of `attempt`, else of the latest attempt of a
    requeued run, else logs/ itself (where batch.out always is)."""
    logs = run_dir / "logs"
    if attempt is None:
        numbers = attempt_numbers(run_dir)
        if not numbers:
            return logs
        attempt = numbers[-1]
    return logs / f"{ATTEMPT_PREFIX}{attempt}"


def new_run_id(now: Optional[float] = None) -> str:
    """Sortable by time (UTC, ms) and unique: 4 random hex digits + exclusive mkdir."""
    stamp = time.time() if now is None else now
    when = datetime.fromtimestamp(stamp, tz=timezone.utc)
    return f"{when:%Y%m%d-%H%M%S}-{int(stamp * 1000) % 1000:03d}-{os.urandom(2).hex()}"


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


def create(paths: RunPaths, share: str = "private") -> RunPaths:
    """Make the run directory; a colliding id (same ms, same random) gets a new one.
    The folders it makes (the run root and the experiment's too, when missing) get the
    share's mode whatever the umask (filemodes.py)."""
    with filemodes.writing(share):
        return _create(paths, share)


def _create(paths: RunPaths, share: str) -> RunPaths:
    for _ in range(20):
        try:
            filemodes.make_dirs(paths.run_dir.parent, share)
            paths.run_dir.mkdir(filemodes.dir_mode(share))
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
    paths.logs.mkdir(filemodes.dir_mode(share))
    filemodes.make_dirs(paths.checkpoint_dir, share)
    return paths


def remove(paths: RunPaths) -> None:
    """Undo create() when a submission fails: nothing is left behind."""
    shutil.rmtree(paths.run_dir, ignore_errors=True)
    if paths.run_dir not in paths.checkpoint_dir.parents:
        shutil.rmtree(paths.checkpoint_dir.parent, ignore_errors=True)


def strip_to_record(paths: RunPaths) -> None:
    """Remove everything of a run but its record (an interrupted start)."""
    for child in list(paths.run_dir.iterdir()) if paths.run_dir.is_dir() else []:
        if child.name == RECORD:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    if paths.run_dir not in paths.checkpoint_dir.parents:
        shutil.rmtree(paths.checkpoint_dir.parent, ignore_errors=True)


SETUP_TAIL_LINES = 10  # of a failed --setup line's output, shown with the error


def log_tail(path: Path, count: int = SETUP_TAIL_LINES) -> list[str]:
    """The last non-blank lines of a log (a failed setup line's own output: "module:
    command not found"); [] when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line.rstrip("\r") for line in text.splitlines() if line.strip()][-count:]
