"""Broadcast copies of ended jobs (issue 33, section 2): a job cancelled or timed out
without --stage never reaches its drop step, so its node-local copies
(hpclaunch-bcast-<job>.<random>.<n>, sent by node/stage_bcast.py) stay in the node's
folder. The stage guard's leftover cleaner and `hpclaunch clean` remove them as they do
dead jobs' folders: only this user's regular files, never a job squeue still lists, never
the guard's own job's. A stand-in `squeue` lists job 42 as running."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpclaunch.node import stage_guard
from test_cli import env as env
from test_cli import hpclaunch

RUNNING = "#!/bin/sh\necho '42 42'\n"  # squeue -h -u USER -o '%A %i'


def _copies(folder: Path) -> dict[str, Path]:
    """Copies of an ended job (41, two files), a running one (42), another user's ended
    job (40), a symlink of an ended job (39) and the guard's own job (44)."""
    folder.mkdir()
    names = {
        "ended": "hpclaunch-bcast-41.aa01.0", "ended2": "hpclaunch-bcast-41.aa01.1",
        "running": "hpclaunch-bcast-42.bb02.0", "other": "hpclaunch-bcast-40.cc03.0",
        "own": "hpclaunch-bcast-44.ee05.0",
    }  # fmt: skip
    paths = {key: folder / name for key, name in names.items()}
    for path in paths.values():
        path.write_bytes(b"image")
    os.chown(paths["other"], 4242, 4242)
    paths["link"] = folder / "hpclaunch-bcast-39.dd04.0"
    paths["link"].symlink_to(paths["running"])
    return paths


def _squeue(tmp_path: Path) -> str:
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "squeue").write_text(RUNNING)
    (folder / "squeue").chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def test_the_guard_removes_copies_of_ended_jobs_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _copies(tmp_path / "tmp")
    monkeypatch.setenv("PATH", _squeue(tmp_path))
    # Attempt 1 of job 44: its copies (no attempt in their names) are in use.
    removed = stage_guard.clean_leftovers(str(tmp_path / "tmp"), "alice", "44-a1")
    assert sorted(removed) == [str(paths["ended"]), str(paths["ended2"])]
    assert [key for key, path in paths.items() if os.path.lexists(path)] == [
        "running", "other", "own", "link",
    ]  # fmt: skip


def test_clean_removes_copies_of_ended_jobs(tmp_path: Path, env: dict[str, str]) -> None:
    paths = _copies(tmp_path / "tmp")
    env["PATH"] = _squeue(tmp_path)
    done = hpclaunch(["clean", "--folder", str(tmp_path / "tmp"), "--json"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    removed = json.loads(done.stdout)["removed"]
    assert sorted(removed) == sorted(str(paths[key]) for key in ("ended", "ended2", "own"))
    assert [key for key, path in paths.items() if os.path.lexists(path)] == [
        "running", "other", "link",
    ]  # fmt: skip
