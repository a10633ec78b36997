"""The code snapshot: what is copied, what is linked, the size limit and the recorded diff.

Each test builds a small git repository in tmp_path; no Slurm is needed.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from hpclaunch.errors import UserError
from hpclaunch.payload import snapshot
from hpclaunch.payload.project import git_root


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-c", "user.email=a@b", "-c", "user.name=n", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A project: tracked code, an ignored data folder and an ignored runs folder."""
    root = tmp_path / "proj"
    (root / "src").mkdir(parents=True)
    (root / "data").mkdir()
    git(root, "init", "-q")
    (root / ".gitignore").write_text("data/\nruns/\n*.log\n__pycache__/\n")
    (root / "train.py").write_text("print('v1')\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "src" / "model.py").write_text("W = 1\n")
    (root / "data" / "train.csv").write_text("a,b\n1,2\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "x")
    return root


def snap(root: Path, dest: Path, exclude: Path | None = None) -> snapshot.SnapshotStats:
    return snapshot.make(snapshot.plan_snapshot(root), dest, exclude)


def test_tracked_and_untracked_copied_with_modes(repo: Path, tmp_path: Path) -> None:
    (repo / "notes.txt").write_text("untracked, not ignored\n")
    (repo / "debug.log").write_text("ignored\n")
    os.utime(repo / "train.py", (1_000_000_000, 1_000_000_000))
    p = snapshot.plan_snapshot(repo)
    assert p.root == repo.resolve()
    assert p.files == (".gitignore", "notes.txt", "run.sh", "src/model.py", "train.py")
    assert p.links == ("data", "debug.log")
    assert p.total_bytes == sum((repo / f).stat().st_size for f in p.files)
    stats = snapshot.make(p, tmp_path / "snap")
    dest = tmp_path / "snap"
    assert (stats.files, stats.bytes, stats.links) == (5, p.total_bytes, 2)
    assert (dest / "notes.txt").read_text() == "untracked, not ignored\n"
    assert (dest / "src" / "model.py").read_text() == "W = 1\n"
    # The execute bit is kept; group and others lose theirs (a private folder: filemodes).
    assert stat.S_IMODE((dest / "run.sh").stat().st_mode) == 0o700
    assert (dest / "train.py").stat().st_mtime == 1_000_000_000
    assert not (dest / "train.py").is_symlink()


def test_ignored_folder_is_linked_and_relative_arguments_resolve(
    repo: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "snap"
    snap(repo, dest)
    assert (dest / "data").is_symlink()
    assert os.readlink(dest / "data") == str(repo.resolve() / "data")
    # A job started in the snapshot with `--data data/train.csv` reads the live data.
    out = subprocess.run(
        ["cat", "data/train.csv"], cwd=dest, capture_output=True, text=True, check=True
    )
    assert out.stdout == "a,b\n1,2\n"


def test_tracked_but_deleted_file_is_skipped(repo: Path, tmp_path: Path) -> None:
    (repo / "src" / "model.py").unlink()
    p = snapshot.plan_snapshot(repo)
    assert "src/model.py" not in p.files
    snapshot.make(p, tmp_path / "snap")
    assert not (tmp_path / "snap" / "src").exists()


def test_odd_file_names(repo: Path, tmp_path: Path) -> None:
    names = ["with space.py", "new\nline.txt", "ünïcode.txt", "-dash.txt", "HEAD"]
    for name in names:
        (repo / name).write_text(name)
    raw = os.fsencode(repo) + b"/latin1-\xe9.txt"  # not UTF-8
    with open(raw, "wb") as f:
        f.write(b"bytes")
    git(repo, "add", "with space.py")
    p = snapshot.plan_snapshot(repo)
    for name in [*names, os.fsdecode(b"latin1-\xe9.txt")]:
        assert name in p.files
    snapshot.make(p, tmp_path / "snap")
    for name in names:
        assert (tmp_path / "snap" / name).read_text() == name
    with open(os.fsencode(tmp_path / "snap") + b"/latin1-\xe9.txt", "rb") as f:
        assert f.read() == b"bytes"


def test_edit_after_make_does_not_change_the_snapshot(repo: Path, tmp_path: Path) -> None:
    dest = tmp_path / "snap"
    snap(repo, dest)
    (repo / "train.py").write_text("print('v2')\n")
    (repo / "src" / "model.py").unlink()
    assert (dest / "train.py").read_text() == "print('v1')\n"
    assert (dest / "src" / "model.py").read_text() == "W = 1\n"


def test_symlinks_stay_symlinks(repo: Path, tmp_path: Path) -> None:
    (repo / "latest.py").symlink_to("train.py")
    p = snapshot.plan_snapshot(repo)
    assert dict(p.largest)["latest.py"] == 0
    snapshot.make(p, tmp_path / "snap")
    assert os.readlink(tmp_path / "snap" / "latest.py") == "train.py"


def test_check_limit(repo: Path) -> None:
    (repo / "weights.bin").write_bytes(b"\0" * 3_000_000)
    p = snapshot.plan_snapshot(repo)
    assert p.largest[0] == ("weights.bin", 3_000_000)
    snapshot.check_limit(p, 10 * 1024 * 1024)  # under the limit: no error
    with pytest.raises(UserError) as err:
        snapshot.check_limit(p, 2 * 1024 * 1024)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("--snapshot-limit: the code snapshot is 2.9 MB (limit 2M). ")
    assert "Largest: weights.bin 2.9 MB, " in line
    assert "--no-snapshot" in line


def test_diff_shows_edits_and_is_empty_when_clean(repo: Path) -> None:
    assert snapshot.diff(repo) == ""
    (repo / "train.py").write_text("print('v2')\n")
    (repo / "src" / "new.py").write_text("staged\n")
    git(repo, "add", "src/new.py")
    text = snapshot.diff(repo)
    assert "diff --git a/train.py b/train.py" in text
    assert "+print('v2')" in text
    assert "+staged" in text
    # The patch applies to the committed tree: it reproduces the submitted code.
    git(repo, "stash", "-q")
    subprocess.run(["git", "apply"], cwd=repo, input=text, text=True, check=True)
    assert (repo / "train.py").read_text() == "print('v2')\n"


def test_diff_without_commits(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    assert snapshot.diff(tmp_path) == ""
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", "a.py")
    text = snapshot.diff(tmp_path)
    assert text.startswith("# hpclaunch: no commits yet")
    assert "+x = 1" in text


def test_outside_git(tmp_path: Path) -> None:
    assert git_root(tmp_path) is None
    assert snapshot.diff(tmp_path) == ""
    with pytest.raises(UserError, match="not inside a git repository"):
        snapshot.plan_snapshot(tmp_path)


def test_plan_from_a_subfolder_uses_the_top_level(repo: Path) -> None:
    assert git_root(repo / "src") == repo.resolve()
    assert snapshot.plan_snapshot(repo / "src") == snapshot.plan_snapshot(repo)


def test_exclude_the_run_folder_inside_the_project(repo: Path) -> None:
    # runs/ ignored: linked, unless it is the run root (then not even linked).
    run_dir = repo / "runs" / "exp" / "20260101-000000-000-abcd"
    (repo / "runs" / "r0").mkdir(parents=True)
    stats = snap(repo, run_dir / "code", exclude=run_dir)
    assert (run_dir / "code" / "runs").is_symlink()
    assert stats.links == 2  # data, runs
    # runs/ not ignored: nothing under the run root is copied (earlier runs, this run's
    # folder and its first snapshot), given to plan() or only to make().
    (repo / ".gitignore").write_text("data/\n")
    (repo / "runs" / "r0" / "old.txt").write_text("old\n")
    p = snapshot.plan_snapshot(repo)
    assert "runs/r0/old.txt" in p.files  # no run root given, r0 is not a run folder's name
    assert not any(f.startswith("runs/exp/") for f in p.files)  # but this one is
    snapshot.make(p, run_dir / "code2", exclude=repo / "runs")
    assert not (run_dir / "code2" / "runs").exists()
    p = snapshot.plan_snapshot(repo, [repo / "runs"])
    assert not any(f.startswith("runs/") for f in p.files) and p.left_out == ("runs",)
    snapshot.make(p, run_dir / "code3")
    assert not (run_dir / "code3" / "runs").exists()


def test_exclude_through_a_symlinked_path(repo: Path, tmp_path: Path) -> None:
    # Clusters often reach home through a symlink; git reports the real path.
    alias = tmp_path / "alias"
    alias.symlink_to(repo)
    (repo / ".gitignore").write_text("data/\n")
    (repo / "runs" / "r0").mkdir(parents=True)
    (repo / "runs" / "r0" / "f.txt").write_text("f")
    snap(alias, alias / "runs" / "r0" / "code", exclude=alias / "runs" / "r0")
    assert not (repo / "runs" / "r0" / "code" / "runs").exists()


def test_folder_of_ignored_files_is_linked_once(repo: Path, tmp_path: Path) -> None:
    # git lists such a folder both as "out/" and as "out/a.log".
    (repo / "out").mkdir()
    (repo / "out" / "a.log").write_text("log")
    (repo / "src" / "__pycache__").mkdir()
    p = snapshot.plan_snapshot(repo)
    assert p.links == ("data", "out")  # and never the live __pycache__
    snapshot.make(p, tmp_path / "snap")
    assert (tmp_path / "snap" / "out").is_symlink()


def test_submodule_is_copied_as_a_tree(repo: Path, tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    (lib / "pkg").mkdir(parents=True)
    git(lib, "init", "-q")
    (lib / "pkg" / "core.py").write_text("CORE = 1\n")
    git(lib, "add", "-A")
    git(lib, "commit", "-qm", "x")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "lib")
    p = snapshot.plan_snapshot(repo)
    assert "lib" in p.files
    stats = snapshot.make(p, tmp_path / "snap")
    assert (tmp_path / "snap" / "lib" / "pkg" / "core.py").read_text() == "CORE = 1\n"
    assert not (tmp_path / "snap" / "lib" / ".git").exists()
    assert stats.files == len(p.files)  # the tree adds lib/pkg/core.py, less "lib" itself


def test_dest_must_not_exist(repo: Path, tmp_path: Path) -> None:
    (tmp_path / "snap").mkdir()
    with pytest.raises(FileExistsError):
        snap(repo, tmp_path / "snap")


def test_human_sizes() -> None:
    assert snapshot.human(512) == "512 B"
    assert snapshot.human(2048) == "2.0 KB"
    assert snapshot.human(327_573_094) == "312.4 MB"
    assert snapshot.human(3 << 30) == "3.0 GB"
