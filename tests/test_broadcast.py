"""Broadcast staging without Slurm (issue 33, part 2): node/stage_bcast.py sends each file
the nodes would read (an archive, every part of a folder's pack) with `sbcast`, and the
stage guard unpacks this node's copies instead of the shared files, then removes them;
a refused sbcast leaves the per-node read, with one note. A stand-in `sbcast` (one node:
cp -p, refusing an existing file as sbcast does without --force) shows the logic; the
testbed test shows the bytes read (tests/test_e2e_venvpack.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from hpclaunch.node import stage_bcast, stage_guard
from hpclaunch.payload import stage
from test_cli import env as env
from test_cli import hpclaunch
from test_stage_packs import _guard_json, _tree

SBCAST = (
    '#!/bin/sh\n[ -e "$3" ] && { echo "sbcast: error: $3 exists" >&2; exit 1; }\n'
    'exec cp -p "$2" "$3"\n'
)
REFUSED = '#!/bin/sh\necho "sbcast: error: Can not open $2" >&2\nexit 1\n'


def _bin(tmp_path: Path, text: str) -> str:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    (folder / "sbcast").write_text(text)
    (folder / "sbcast").chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def _items(tmp_path: Path) -> tuple[stage.StageItem, ...]:
    _tree(tmp_path / "data")
    with tarfile.open(tmp_path / "ball.tar", "w") as tar:
        tar.add(tmp_path / "data", arcname=".")
    items = tuple(stage.plan_stage(["data", "ball.tar:BALL"], tmp_path, tmp_path / "runs"))
    stage.pack_all(items, io.StringIO())
    return items


def _send(tmp_path: Path, spec: dict[str, object], path: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "stage.json").write_text(json.dumps(spec))
    (tmp_path / "local-parent").mkdir(exist_ok=True)
    env = {
        "PATH": path,
        "SLURM_JOB_ID": "42",
        "HPCLAUNCH_LOCAL_PARENT": str(tmp_path / "local-parent"),
    }
    return subprocess.run(
        [sys.executable, "-I", "-S", stage_bcast.__file__, str(tmp_path / "stage.json"),
         str(tmp_path / "broadcast.json")],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_the_guard_unpacks_the_broadcast_copies_and_removes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = _items(tmp_path)
    spec = _guard_json(tmp_path, items)
    done = _send(tmp_path, spec, _bin(tmp_path, SBCAST))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    sent = json.loads((tmp_path / "broadcast.json").read_text())
    pack, ball = items
    parts = sorted(p for p in os.listdir(pack.archive) if p.endswith(".tar"))
    assert sorted(sent) == sorted([*(os.path.join(pack.archive, p) for p in parts), ball.archive])
    copies = sorted(os.listdir(tmp_path / "local-parent"))
    assert len(copies) == len(sent) and all(c.startswith("hpclaunch-bcast-42.") for c in copies)
    assert ((tmp_path / "broadcast.json").stat().st_mode & 0o777) == 0o600
    # The nodes read the copies: the shared archive's bytes swapped, the data unchanged.
    real = Path(ball.archive).read_bytes()
    Path(ball.archive).write_bytes(b"\0" * len(real))
    monkeypatch.setenv(stage_guard.HPCLAUNCH_STAGE_BCAST, str(tmp_path / "broadcast.json"))
    monkeypatch.setattr(stage_guard, "COPIES", stage_guard.broadcast_copies(os.environ))
    local = tmp_path / "node-local"
    stage_guard.prepare(spec, str(local))
    for name in ("DATA", "BALL"):
        assert (local / "data" / name / "sub" / "f.txt").read_text() == "dataset"
    assert os.listdir(tmp_path / "local-parent") == [] and stage_guard.COPIES == {}


def test_a_refused_sbcast_leaves_the_per_node_read_with_a_note(tmp_path: Path) -> None:
    items = _items(tmp_path)
    spec = _guard_json(tmp_path, items)
    done = _send(tmp_path, spec, _bin(tmp_path, REFUSED))
    assert done.returncode == 0
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("hpclaunch: note: sbcast of ")
    assert "each node reads it and what follows from the shared file system" in done.stderr
    # Only the refused copy's name, for the guards to remove what a node may hold of it.
    [(key, partial)] = json.loads((tmp_path / "broadcast.json").read_text()).items()
    assert key == "" and os.path.basename(partial).startswith("hpclaunch-bcast-42.")
    bare = tmp_path / "nobin"
    bare.mkdir()
    done = _send(tmp_path, spec, str(bare))
    assert done.stderr == "hpclaunch: note: no sbcast here: each node reads the shared copy\n"


def test_copies_must_be_this_users_regular_files(tmp_path: Path) -> None:
    shared = tmp_path / "shared.tar"
    shared.write_bytes(b"x")
    link = tmp_path / "copy-link"
    link.symlink_to(shared)
    plain = tmp_path / "copy"
    shutil.copy(shared, plain)
    (tmp_path / "map.json").write_text(
        json.dumps({"/a": str(link), "/b": str(plain), "/c": "/nope"})
    )
    found = stage_guard.broadcast_copies(
        {stage_guard.HPCLAUNCH_STAGE_BCAST: str(tmp_path / "map.json")}
    )
    assert found == {"/b": str(plain)}


def test_the_batch_script_broadcasts_before_the_guards_on_more_than_one_node(
    tmp_path: Path, env: dict[str, str]
) -> None:
    _tree(tmp_path / "data")
    scripts = {}
    for nodes in ("1", "2"):
        proc = hpclaunch(
            ["run", "--dry-run", "--cluster", "lumi", "-N", nodes, "-A", "project_465000000",
             "-p", "standard-g", "--stage", "data", "--", "python", "train.py"],
            tmp_path, env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        scripts[nodes] = proc.stdout.splitlines()
    assert not any("stage_bcast.py" in line for line in scripts["1"])  # nothing to share
    lines = scripts["2"]
    send = next(i for i, line in enumerate(lines) if "stage_bcast.py" in line)
    guard = next(i for i, line in enumerate(lines) if "stage_node.py run" in line)
    assert send < guard
    words = lines[send].split()
    assert words[-2].endswith("/stage.json") and words[-1].endswith("/broadcast.json")
    assert lines[send - 1] == f"export HPCLAUNCH_STAGE_BCAST={words[-1]}"
