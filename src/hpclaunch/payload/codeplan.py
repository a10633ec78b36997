"""Which code a run runs: a snapshot made at submission (clusters, by default), a copy
of an earlier run's snapshot for `rerun`, or the live working folder; and what the
record keeps of it (commit, dirtiness, the uncommitted diff, the snapshot's size)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpclaunch.config.jobspec import JobSpec
from hpclaunch.payload import snapshot
from hpclaunch.payload.project import git_root
from hpclaunch.records.runpaths import RunPaths, absolute

CODE = "code"  # the snapshot's folder inside the run directory
DIFF = "git.diff"


@dataclass(frozen=True)
class CodePlan:
    cwd: Path  # where the job starts
    root: Optional[Path]  # the git top level (None outside git)
    plan: Optional[snapshot.SnapshotPlan]  # a snapshot to make at submission
    reused: Optional[Path] = None  # rerun: an earlier run's snapshot folder
    note: str = ""  # said on stderr at submission


def plan_code(spec: JobSpec, cwd: Path, paths: RunPaths, reuse: Optional[Path] = None) -> CodePlan:
    """Decide before anything is written; a snapshot over the limit is refused here."""
    root = git_root(cwd)
    if reuse is not None:
        # The rerun's own copy of the snapshot (write_code makes it): never the earlier one.
        rel = cwd.relative_to(root) if root and cwd.is_relative_to(root) else Path()
        start = rel if (reuse / rel).is_dir() else Path()
        return CodePlan(cwd=paths.run_dir / CODE / start, root=root, plan=None, reused=reuse)
    if not spec.snapshot:
        return CodePlan(cwd=cwd, root=root, plan=None)
    if root is None:
        return CodePlan(
            cwd=cwd,
            root=None,
            plan=None,
            note=f"hpclaunch: no code snapshot: {cwd} is not in a git repository; "
            "the job runs the folder as it is when it starts",
        )
    found = snapshot.plan_snapshot(root, outputs(spec, cwd, paths))
    snapshot.check_limit(found, spec.snapshot_limit_bytes)
    return CodePlan(cwd=paths.run_dir / CODE / cwd.relative_to(root), root=root, plan=found)


def outputs(spec: JobSpec, cwd: Path, paths: RunPaths) -> list[Path]:
    """Where this run's hpclaunch writes: never in its snapshot where inside the project.
    The run root (relative to cwd, as runpaths places runs) holds the run folders and the
    stage cache; when it is the project or above it, the experiment's folder and the
    stage cache are what lie inside. Earlier runs' folders elsewhere in the project are
    recognised by snapshot.plan_snapshot() itself."""
    run_root = absolute(spec.run_root, cwd)
    found = [run_root, run_root / snapshot.STAGE_CACHE, paths.run_dir.parent]
    if spec.checkpoint_root:
        found += [absolute(spec.checkpoint_root, cwd), paths.checkpoint_dir.parent.parent]
    return found


def write_code(code: CodePlan, paths: RunPaths, run_root: Path) -> dict[str, Any]:
    """Make the snapshot and keep the diff; returns the record's `code` entry."""
    entry: dict[str, Any] = {"cwd": str(code.cwd)}
    if code.reused is not None:  # rerun: a copy of the earlier run's code, its diff
        stats = snapshot.copy_snapshot(code.reused, paths.run_dir / CODE)
        entry["snapshot"] = {
            "dir": str(paths.run_dir / CODE),
            "reused": True,
            "from": str(code.reused),
            "files": stats.files,
            "bytes": stats.bytes,
            "links": stats.links,
            "seconds": round(stats.seconds, 3),
        }
        if (code.reused.parent / DIFF).is_file():
            entry["diff"] = str(code.reused.parent / DIFF)
        return entry
    if code.root is not None:
        started = time.monotonic()
        text = snapshot.diff(code.root)
        if text:
            (paths.run_dir / DIFF).write_bytes(text.encode("utf-8", "surrogateescape"))
            entry["diff"] = DIFF
        entry["diff_seconds"] = round(time.monotonic() - started, 3)
    if code.plan is not None:
        # The plan already leaves the run root out; run_root: also for a plan made elsewhere.
        stats = snapshot.make(code.plan, paths.run_dir / CODE, exclude=run_root)
        entry["snapshot"] = {
            "dir": str(paths.run_dir / CODE),
            "files": stats.files,
            "bytes": stats.bytes,
            "links": stats.links,
            "seconds": round(stats.seconds, 3),
        }
    return entry
