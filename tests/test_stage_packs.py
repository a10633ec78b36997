"""A directory's pack cannot write outside its folder (issue 24, item 2) and the stage
cache stays bounded and consistent (issue 25, item 4), without Slurm: the tars are
read back with tarfile at pack time, symlinks are made last and only inside the tree,
the cache must be the user's alone, stage.json pins each part's size and mtime, two
processes packing at once both succeed, and pruning keeps what the profile says."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpclaunch.config.jobspec import JobSpec, StageItem
from hpclaunch.errors import UserError
from hpclaunch.node import stage_guard
from hpclaunch.payload import stage, stagecache
from hpclaunch.records import runpaths
from hpclaunch.script import render


def _tree(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_text("dataset")
    (root / "top.txt").write_text("top")


def _guard_json(tmp_path: Path, items: tuple[StageItem, ...]) -> dict[str, object]:
    spec = JobSpec(cluster="local", program=("x",), stage=items)
    paths = runpaths.RunPaths(run_id="r", run_dir=tmp_path / "run", checkpoint_dir=tmp_path / "c")
    return render.stage_json(spec, paths)


def _unpack(tmp_path: Path, items: tuple[StageItem, ...]) -> Path:
    local = tmp_path / "node-local"
    stage_guard.prepare(_guard_json(tmp_path, items), str(local))
    return local / "data" / items[0].name


# --- issue 24, item 2: packs cannot write outside their folder ------------------------


def test_a_folder_swapped_for_a_symlink_while_packing_is_refused(tmp_path: Path) -> None:
    """The tree is listed with sub/ a folder; before tar reads it, sub becomes a symlink
    to another folder of the victim's. Today part 00 holds `sub` as a symlink and part 01
    `sub/f.txt`: unpacked in that order, the file lands through the link, in the
    victim's folder. The parts read back against the listing refuse it, keep no pack."""
    src, victim = tmp_path / "data", tmp_path / "victim"
    _tree(src)
    victim.mkdir()
    (victim / "f.txt").write_text("victim's own")
    listing = stage.manifest(str(src))
    (src / "sub").rename(tmp_path / "moved")
    (src / "sub").symlink_to(victim)
    folder = tmp_path / "runs" / stage.CACHE / "DATA-k"
    with pytest.raises(UserError) as caught:
        stage.pack(str(src), folder, listing, io.StringIO())
    assert "sub is a symlink, listed as a folder" in str(caught.value)
    assert "the folder changed while it was packed" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not folder.exists() and os.listdir(folder.parent) == []
    assert (victim / "f.txt").read_text() == "victim's own"


@pytest.mark.parametrize(
    ("name", "target"),
    [("out", "../victim"), ("abs", "/etc"), ("hop", "inner/../.."), ("via", "up/x")],
)
def test_a_symlink_leading_out_of_the_tree_is_refused_at_pack_time(
    tmp_path: Path, name: str, target: str
) -> None:
    """Relative, absolute, '..' after a folder, and through another link of the tree
    (up -> ..: every link is followed as the kernel would)."""
    src = tmp_path / "data"
    _tree(src)
    (src / "inner").mkdir()
    (src / "up").symlink_to("..")
    (src / name).symlink_to(target)
    [item] = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
    with pytest.raises(UserError) as caught:
        stage.pack_all((item,), io.StringIO())
    assert "points outside the staged folder" in str(caught.value)
    assert not Path(item.archive).exists()


def test_links_are_made_last_and_point_inside(tmp_path: Path) -> None:
    """Links to a file, a folder, through another link, dangling and looping still come
    through, into a read-only folder too; links.tar is a part of its own."""
    src = tmp_path / "data"
    _tree(src)
    (src / "ro").mkdir()
    (src / "ro" / "back").symlink_to("../sub/f.txt")
    (src / "to-dir").symlink_to("sub")
    (src / "via").symlink_to("to-dir/f.txt")
    (src / "dangling").symlink_to("nowhere")
    (src / "loop").symlink_to("loop")
    (src / "ro").chmod(0o555)
    [item] = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
    stage.pack_all((item,), io.StringIO())
    assert sorted(os.listdir(item.archive)) == [
        ".source",
        "links.tar",
        "part-00.tar",
        "part-01.tar",
    ]
    out = _unpack(tmp_path, (item,))
    assert (out / "ro" / "back").read_text() == "dataset"
    assert (out / "via").read_text() == "dataset"
    assert os.readlink(out / "dangling") == "nowhere"
    assert (out / "ro").stat().st_mode & 0o777 == 0o555


def test_the_guard_makes_no_link_out_of_the_tree_nor_under_another(tmp_path: Path) -> None:
    """The node checks links.tar again before it makes a single link (a pack written by
    something else than this packer)."""
    import tarfile

    src = tmp_path / "data"
    _tree(src)
    [item] = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
    stage.pack_all((item,), io.StringIO())
    links = Path(item.archive) / "links.tar"
    with tarfile.open(links, "w") as tar:
        for name, target in (("sub2", "sub"), ("sub2/x", "/etc/passwd")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    with pytest.raises(OSError, match="sub2/x lies under another symlink"):
        _unpack(tmp_path, (item,))


def test_a_part_changed_after_packing_is_not_unpacked(tmp_path: Path) -> None:
    """stage.json pins each part's size and mtime; the guard refuses a part rewritten
    since (here: the same size, another mtime) before unpacking anything."""
    src = tmp_path / "data"
    _tree(src)
    [item] = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
    stage.pack_all((item,), io.StringIO())
    recorded = _guard_json(tmp_path, (item,))["items"][0]["parts"]  # type: ignore[index]
    assert [p[0] for p in recorded] == ["part-00.tar", "part-01.tar"]
    part = Path(item.archive) / "part-01.tar"
    assert [part.stat().st_size, part.stat().st_mtime_ns] == recorded[1][1:]
    spec = _guard_json(tmp_path, (item,))
    os.utime(part, ns=(part.stat().st_atime_ns, part.stat().st_mtime_ns + 10**9))
    local = tmp_path / "node-local"
    with pytest.raises(OSError, match=r"part-01\.tar changed since it was packed"):
        stage_guard.prepare(spec, str(local))
    assert not (local / "data" / "DATA" / "top.txt").exists()
    # Put back as packed, but another user's (chown keeps the size and mtime).
    os.utime(part, ns=(part.stat().st_atime_ns, recorded[1][2]))
    os.chown(part, os.getuid() + 4242, -1)
    with pytest.raises(OSError, match=r"part-01\.tar is not yours"):
        stage_guard.prepare(spec, str(local))


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "another owner", "symlink"])
def test_a_cache_folder_others_can_write_is_refused(tmp_path: Path, how: str) -> None:
    """One line naming the folder and the fix, at planning (a dry-run too) and packing."""
    src = tmp_path / "data"
    _tree(src)
    cache = tmp_path / "runs" / stage.CACHE
    cache.parent.mkdir()
    if how == "symlink":
        (tmp_path / "elsewhere").mkdir()
        cache.symlink_to(tmp_path / "elsewhere")
    else:
        cache.mkdir()
        cache.chmod({"group-writable": 0o770, "world-writable": 0o777}.get(how, 0o700))
        if how == "another owner":
            os.chown(cache, os.getuid() + 4242, -1)
    with pytest.raises(UserError) as caught:
        stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
    line = str(caught.value)
    assert f"the pack cache {cache} is" in line and "\n" not in line
    assert "chmod go-w" in line
    assert not any(Path(tmp_path, "elsewhere").glob("*")) if how == "symlink" else True


def test_the_cache_is_made_private(tmp_path: Path) -> None:
    src = tmp_path / "data"
    _tree(src)
    old = os.umask(0)
    try:
        [item] = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
        stage.pack_all((item,), io.StringIO())
    finally:
        os.umask(old)
    assert (tmp_path / "runs" / stage.CACHE).stat().st_mode & 0o777 == 0o700


# --- issue 25, item 4: the stage cache ---------------------------------------------------

_PACK_WHEN_TOLD = """
import io, os, sys, time
from pathlib import Path
from hpclaunch.payload import stage
cwd, go = Path(sys.argv[1]), Path(sys.argv[2])
items = stage.plan_stage(["data"], cwd, cwd / "runs")
(cwd / f"planned-{os.getpid()}").touch()
while not go.exists():
    time.sleep(0.005)
err = io.StringIO()
stage.pack_all(items, err)
print(items[0].archive)
print(err.getvalue().strip().splitlines()[-1])
"""


def test_two_processes_packing_the_same_changed_tree_both_succeed(tmp_path: Path) -> None:
    """Both list the tree, then pack at the same moment; today the second rename fails
    with "Directory not empty". Now the later one keeps the earlier's complete pack."""
    src = tmp_path / "data"
    for i in range(3000):  # enough that both are packing when the first one finishes
        path = src / f"d{i % 30}" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(2048))
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PACK_WHEN_TOLD, str(tmp_path), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("planned-*"))) < 2:  # both have planned and wait
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    go.touch()
    results = [proc.communicate(timeout=120) for proc in procs]
    for (_out, err), proc in zip(results, procs):
        assert proc.returncode == 0, err
    archives = {out.splitlines()[0] for out, _ in results}
    lasts = [out.splitlines()[1] for out, _ in results]
    assert len(archives) == 1
    assert sum("was packed by another run meanwhile" in line for line in lasts) == 1
    cache = tmp_path / "runs" / stage.CACHE
    assert os.listdir(cache) == [os.path.basename(archives.pop())]  # no half pack left


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pruning asks the testbed's Slurm which packs jobs use (none of this test's)."""
    import testbed

    conf = testbed.slurm_conf()
    if conf is None:
        pytest.skip("pruning asks squeue: no Slurm testbed here")
    monkeypatch.setenv("SLURM_CONF", str(conf))


def _pack_version(tmp_path: Path, src: Path, version: int, age_s: float) -> str:
    """Pack `src` with version's content and make it last used age_s seconds ago."""
    (src / "v.bin").write_bytes(os.urandom(400 * 1024) + bytes([version]))
    [item] = stage.plan_stage([f"{src}:{src.name.upper()}"], tmp_path, tmp_path / "runs")
    stage.pack_all((item,), io.StringIO())
    then = time.time() - age_s
    os.utime(item.archive, (then, then))
    return item.archive


def test_pruning_keeps_the_newest_packs_per_source_and_the_size_limit(
    tmp_path: Path, slurm: None
) -> None:
    """Small sizes through the profile's keys: three versions of A, one of B; keep 2 per
    source drops A's oldest, a 1 MiB limit then drops the least recently used others;
    the pack the run uses and one used in the last minutes always stay."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    a1 = _pack_version(tmp_path, a, 1, 5000)
    b1 = _pack_version(tmp_path, b, 1, 4000)
    a2 = _pack_version(tmp_path, a, 2, 3000)
    a3 = _pack_version(tmp_path, a, 3, 2000)
    cache = tmp_path / "runs" / stage.CACHE
    assert len(stagecache.packs(cache)) == 4  # never pruned without limits (today: ever)
    err = io.StringIO()
    gone = stagecache.prune(cache, stagecache.Limits(keep=2, max_bytes=2**40), [a3], {}, err)
    assert [p.path for p in gone] == [a1]
    assert "removed 1 older pack(s)" in err.getvalue()
    from hpclaunch.config.profiles import Profile

    profile = Profile.model_validate({"name": "t", "stage_cache_max": "1M"})
    limits = stagecache.limits(profile)
    assert limits == stagecache.Limits(keep=2, max_bytes=2**20)
    a4 = _pack_version(tmp_path, a, 4, 0)  # the run's own, just packed
    gone = stagecache.prune(cache, limits, [a4], {}, io.StringIO())
    # A: a2 goes by "2 per source"; a3, a4, b1 (400 KiB each) exceed 1 MiB: b1 goes.
    assert sorted(p.path for p in gone) == sorted([b1, a2])
    assert sorted(p.path for p in stagecache.packs(cache)) == sorted([a3, a4])
    # A pack used minutes ago is never pruned (a run being started may use it).
    recent = _pack_version(tmp_path, b, 2, 60)
    assert stagecache.prune(cache, stagecache.Limits(0, 0), [a4], {}, io.StringIO()) != []
    assert {p.path for p in stagecache.packs(cache)} == {a4, recent}


def test_pack_all_prunes_with_the_profile_limits(tmp_path: Path, slurm: None) -> None:
    src = tmp_path / "data"
    src.mkdir()
    first = _pack_version(tmp_path, src, 1, 5000)
    _pack_version(tmp_path, src, 2, 4000)
    (src / "v.bin").write_bytes(b"3")
    [item] = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
    err = io.StringIO()
    stage.pack_all((item,), err, stagecache.Limits(keep=2, max_bytes=2**40), {})
    assert not os.path.exists(first) and os.path.isdir(item.archive)
    assert len(stagecache.packs(tmp_path / "runs" / stage.CACHE)) == 2


def test_stage_json_lists_parts_of_the_run_written(tmp_path: Path) -> None:
    src = tmp_path / "data"
    _tree(src)
    [item] = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
    assert _guard_json(tmp_path, (item,))["items"][0]["parts"] == []  # type: ignore[index]
    stage.pack_all((item,), io.StringIO())
    data = json.loads(json.dumps(_guard_json(tmp_path, (item,))))
    assert len(data["items"][0]["parts"]) == 2


def test_hard_linked_files_are_packed_as_files(tmp_path: Path) -> None:
    """tar stores a second link to a file as a hard-link member; --hard-dereference
    stores it as the file, which the read-back accepts and the node unpacks."""
    src = tmp_path / "data"
    _tree(src)
    os.link(src / "sub" / "f.txt", src / "twin.txt")
    [item] = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
    stage.pack_all((item,), io.StringIO())
    assert (_unpack(tmp_path, (item,)) / "twin.txt").read_text() == "dataset"


def test_the_jobs_packs_come_from_their_scripts_folder(tmp_path: Path) -> None:
    """squeue's %o is the batch script's path, with --chain's argument after it (and a
    path may hold spaces): its folder's spec.json names the packs."""
    run = tmp_path / "runs" / "my exp" / "r1"
    run.mkdir(parents=True)
    (run / "job.sh").write_text("#!/bin/bash\n")
    (run / "spec.json").write_text(json.dumps({"stage": [{"archive": "/c/DATA-1"}]}))
    assert stagecache._staged(f"{run}/job.sh 3") == [{"archive": "/c/DATA-1"}]
    assert stagecache._staged(f"{run}/job.sh") == [{"archive": "/c/DATA-1"}]
    assert stagecache._staged("/usr/bin/sleep 100") == []
    assert stagecache._staged("(null)") == []


def test_clean_empties_the_cache_but_packs_in_use_and_abandoned_halves_go(
    tmp_path: Path, slurm: None
) -> None:
    """`clean --stage-cache`'s logic: every pack but one a run started this minute uses
    (no job of this user's uses one); a hidden half-written pack untouched for a day
    goes, one being written now stays; --dry-run removes nothing."""
    src = tmp_path / "data"
    src.mkdir()
    old = _pack_version(tmp_path, src, 1, 3600)
    new = _pack_version(tmp_path, src, 2, 10)
    cache = tmp_path / "runs" / stage.CACHE
    killed, writing = cache / ".DATA-1.abc", cache / ".DATA-2.def"
    killed.mkdir()
    writing.mkdir()
    os.utime(killed, (time.time() - 2 * 86400,) * 2)
    done = stagecache.empty(cache, {}, dry_run=True)
    assert done is not None
    assert sorted(p.path for p in done[0]) == sorted([old, str(killed)])
    assert [p.path for p in done[1]] == [new] and killed.exists()
    assert stagecache.empty(cache, {}, dry_run=False) is not None
    assert sorted(os.listdir(cache)) == sorted([writing.name, os.path.basename(new)])
