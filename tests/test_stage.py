"""Staging pieces without Slurm: names, kinds, the pack cache, capacity, stage-out
parsing, and the node-side unpack / stage-out / cleanup run in-process."""

from __future__ import annotations

import io
import os
import signal
import tarfile
import time
from pathlib import Path
from types import FrameType
from typing import Optional

import pytest

from hpclaunch.config.jobspec import JobSpec, StageItem
from hpclaunch.errors import UserError
from hpclaunch.node import stage_guard
from hpclaunch.payload import stage, stagepack
from hpclaunch.records import runpaths
from hpclaunch.script import render


def _tree(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "x.txt").write_text("x")
    (root / "top.txt").write_text("top")
    (root / "empty").mkdir()


def test_names_default_to_the_base_name_upper_cased(tmp_path: Path) -> None:
    (tmp_path / "my-data.v2").mkdir()
    assert stage.parse("my-data.v2", tmp_path) == (str(tmp_path / "my-data.v2"), "MY_DATA_V2")
    assert stage.parse(f"{tmp_path}/my-data.v2:train", tmp_path)[1] == "TRAIN"
    with pytest.raises(UserError, match="does not exist"):
        stage.parse("nope", tmp_path)


def test_kinds(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f.bin").write_bytes(b"data")
    (tmp_path / "a.tar.gz").write_bytes(b"")
    (tmp_path / "img.sqfs").write_bytes(b"hsqs" + b"\0" * 60)
    kinds = {n: stage.kind_of(str(tmp_path / n)) for n in ("d", "f.bin", "a.tar.gz", "img.sqfs")}
    assert kinds == {
        "d": "directory",
        "f.bin": "file",
        "a.tar.gz": "archive",
        "img.sqfs": "squashfs",
    }


def test_pack_is_reused_until_a_file_changes(tmp_path: Path) -> None:
    src = tmp_path / "data"
    _tree(src)
    root = tmp_path / "runs"
    [item] = stage.plan_stage(["data"], tmp_path, root)
    assert item.size == 4 and not Path(item.archive).exists()
    stage.pack_all((item,), io.StringIO())
    inodes = [os.stat(p).st_ino for p in stage.parts(item.archive)]
    names: list[str] = []
    for part in stage.parts(item.archive):
        with tarfile.open(part) as tar:
            names += tar.getnames()
    assert sorted(names) == ["a", "a/b", "a/b/x.txt", "empty", "top.txt"]
    [again] = stage.plan_stage(["data"], tmp_path, root)
    assert again.archive == item.archive
    stage.pack_all((again,), io.StringIO())
    assert [os.stat(p).st_ino for p in stage.parts(item.archive)] == inodes
    os.utime(src / "a" / "b" / "x.txt", ns=(1, 1))
    [touched] = stage.plan_stage(["data"], tmp_path, root)
    assert touched.archive != item.archive


def test_a_ctrl_c_as_the_pack_folder_appears_leaves_no_partial_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interrupt comes at the first moment the temporary folder is there (a user's
    Ctrl-C or SIGTERM while hpclaunch starts its progress bar): it is removed all the
    same (test_local_hardening's interrupted start met this once, on a fast start)."""
    _tree(tmp_path / "data")
    [item] = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(stage, "_progress", interrupted)
    with pytest.raises(KeyboardInterrupt):
        stage.pack_all((item,), io.StringIO())
    cache = Path(item.archive).parent
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []
    assert not Path(item.archive).exists()


def test_big_folders_are_packed_in_balanced_parts_with_the_folders_last() -> None:
    items = [("d", 0, 0, True)] + [(f"d/f{i:05d}", 100 + i % 7, 0, False) for i in range(9000)]
    parts = stage.split(items)
    assert parts[0] == ["d"] and len(parts) == 1 + 4  # 9000 files: 4 file parts
    sizes = [sum(100 + int(name[-5:]) % 7 for name in part) for part in parts[1:]]
    assert max(sizes) - min(sizes) <= 107
    assert sorted(n for part in parts[1:] for n in part) == [n for n, _, _, d in items if not d]


def test_capacity_is_checked_with_both_numbers() -> None:
    items = (StageItem("D", "/d", "directory", "/t.tar", 3 * 2**20),)
    stage.check_capacity(items, 4, None, "nodes")
    with pytest.raises(UserError, match=r"3M to stage on every node \(nodes have 2M"):
        stage.check_capacity(items, 2, None, "nodes")
    with pytest.raises(UserError, match=r"memory-backed /tmp \(the job asks for 2M"):
        stage.check_capacity(items, None, 2, "nodes")


def test_stage_out_parsing(tmp_path: Path) -> None:
    assert stage.parse_stage_out(["out:res"], tmp_path) == (("out", str(tmp_path / "res")),)
    for bad in ("out", "/abs:res", "../up:res"):
        with pytest.raises(UserError):
            stage.parse_stage_out([bad], tmp_path)


def test_node_side_unpacks_copies_back_and_cleans(tmp_path: Path) -> None:
    src = tmp_path / "data"
    _tree(src)
    (tmp_path / "one.bin").write_bytes(b"1")
    items = stage.plan_stage(["data", "one.bin:ONE"], tmp_path, tmp_path / "runs")
    stage.pack_all(items, io.StringIO())
    spec = JobSpec(cluster="local", program=("x",), nodes=2, stage=items,
                   stage_out=(("out", str(tmp_path / "res")),))  # fmt: skip
    paths_json = render.stage_json(spec, _paths(tmp_path))
    local = tmp_path / "node-local"
    local.mkdir(mode=0o700)
    stage_guard.prepare(paths_json, str(local))
    assert (local / "data" / "DATA" / "a" / "b" / "x.txt").read_text() == "x"
    assert (local / "data" / "ONE" / "one.bin").read_bytes() == b"1"
    (local / "out" / "sub").mkdir(parents=True)
    (local / "out" / "sub" / "r.txt").write_text("r")
    stage_guard.finish(paths_json, str(local), "nodeA")
    assert (tmp_path / "res" / "nodeA" / "sub" / "r.txt").read_text() == "r"
    assert not local.exists()
    env = dict(render.data_env(spec))
    assert set(env) == {"HPCLAUNCH_DATA_DATA", "HPCLAUNCH_DATA_ONE"}


def _paths(tmp_path: Path) -> runpaths.RunPaths:
    return runpaths.RunPaths(run_id="r", run_dir=tmp_path / "run", checkpoint_dir=tmp_path / "c")


def test_leftovers_are_only_this_users(tmp_path: Path) -> None:
    names = ("hpclaunch-1.abc", "hpclaunch-2.def", "hpclaunch-3.ghi", "u-other-4", "hpclaunch-5")
    for name in names:
        (tmp_path / name).mkdir()
    os.chown(tmp_path / "hpclaunch-3.ghi", 4242, 4242)  # another user's, whatever its name
    (tmp_path / "hpclaunch-6.jkl").symlink_to(tmp_path / "u-other-4")
    (tmp_path / "hpclaunch-local-9-p1.mno").mkdir()  # a local run's: clean asks its launcher
    found = sorted(os.path.basename(p) for p in stage_guard.leftovers(str(tmp_path), "2"))
    assert found == ["hpclaunch-1.abc"]
    found = sorted(os.path.basename(p) for p in stage_guard.leftovers(str(tmp_path), local=True))
    assert found == ["hpclaunch-1.abc", "hpclaunch-2.def", "hpclaunch-local-9-p1.mno"]


def test_squashfs_is_mounted_by_apptainer_and_ram_backed_tmp_counts_against_mem(
    tmp_path: Path,
) -> None:
    """LUMI: a staged SquashFS image is bound with image-src=/ (not unpacked), and /tmp in
    memory means the staged size must fit in the memory the job asks for. The image is a
    stand-in file with a SquashFS header (no LUMI here)."""
    from hpclaunch.planning import preparing

    image = tmp_path / "data.sqfs"
    image.write_bytes(b"hsqs" + b"\0" * 1000)
    sif = tmp_path / "t.sif"
    sif.write_bytes(b"#!/usr/bin/env run-singularity\nSIF_MAGIC")
    cli = {
        "cluster": "lumi", "account": "project_465000000", "partition": "small-g",
        "gpus_per_node": "1", "container": str(sif), "stage": (str(image),),
    }  # fmt: skip
    env = {"USER": "alice", "HOME": str(tmp_path)}
    spec = preparing.prepare_spec(cli, ("python", "t.py"), tmp_path, env).spec
    assert spec.container is not None
    assert f"{image}:/hpclaunch-data/DATA_SQFS:image-src=/" in [
        b.spec() for b in spec.container.binds
    ]
    assert dict(render.data_env(spec))["HPCLAUNCH_DATA_DATA_SQFS"] == "/hpclaunch-data/DATA_SQFS"
    image.write_bytes(b"hsqs" + b"\0" * (70 * 2**20))  # 70M on a 60G-per-GPU job: fine
    preparing.prepare_spec(cli, ("python", "t.py"), tmp_path, env)
    with pytest.raises(UserError, match="memory-backed /tmp"):
        preparing.prepare_spec({**cli, "mem_per_gpu": "64M"}, ("python", "t.py"), tmp_path, env)


def test_parts_unpack_side_by_side_into_read_only_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many parts (a small FILES_PER_PART), a read-only folder in the source: every file
    arrives, and the folder's mode is the source's in the end. (Run as root, as in CI,
    the read-only mode cannot block a write; the testbed tests unpack as a user.)"""
    monkeypatch.setattr(stagepack, "FILES_PER_PART", 5)
    src = tmp_path / "data"
    for d in range(6):
        (src / f"d{d}" / "deep").mkdir(parents=True)
        for f in range(8):
            (src / f"d{d}" / "deep" / f"f{f}").write_text(f"{d}-{f}")
    (src / "d3").chmod(0o555)
    try:
        [item] = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
        stage.pack_all((item,), io.StringIO())
        assert len(stage.parts(item.archive)) == 1 + 8
        local = tmp_path / "local"
        local.mkdir(mode=0o700)
        spec = JobSpec(cluster="local", program=("x",), stage=(item,))
        stage_guard.prepare(render.stage_json(spec, _paths(tmp_path)), str(local))
        got = local / "data" / "DATA"
        assert sorted(str(p.relative_to(got)) for p in got.rglob("f*")) == sorted(
            f"d{d}/deep/f{f}" for d in range(6) for f in range(8)
        )
        assert (got / "d3").stat().st_mode & 0o777 == 0o555
        (got / "d3").chmod(0o755)
    finally:
        (src / "d3").chmod(0o755)


def test_signals_held_arrive_after_the_block_with_their_own_handler() -> None:
    """run_all starts each tar inside signals_held: a raising handler (Ctrl-C,
    hpclaunch's SIGTERM) that fired inside Popen would leave an untracked tar unpacking
    into the folder being removed (seen: an interrupted local run left /tmp data)."""
    seen: list[str] = []

    def handler(signum: int, frame: Optional[FrameType]) -> None:
        seen.append(f"handler {signum}")
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(KeyboardInterrupt), stage_guard.signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # a handler would run here, at the next bytecode
            seen.append("block done")
        assert seen == ["block done", f"handler {int(signal.SIGTERM)}"]
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, old)


def test_an_interrupted_run_all_leaves_no_command_running(tmp_path: Path) -> None:
    def stop(signum: int, frame: Optional[FrameType]) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, stop)
    pids = tmp_path / "pids"
    command = ["sh", "-c", f"echo $$ >> {pids}; exec sleep 30"]
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            stage_guard.run_all([command, command, command], 2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 2
    for pid in started:  # killed and reaped: no such process any more
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
