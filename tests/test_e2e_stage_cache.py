"""The stage cache on the testbed (issue 25, item 4): pruned after each packing run by
the profile's limits, never a pack a queued or running job uses (Slurm asked once),
and emptied by `hpclaunch clean --stage-cache` (a preview with --dry-run) but for the
packs in use."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest

import testbed
from conftest import Hpc

pytestmark = pytest.mark.testbed


def _packs(hpc: Hpc) -> list[Path]:
    return sorted((hpc.cwd / "runs" / ".stage-cache").glob("DATA-*"))


def _age(pack: Path, seconds: float) -> None:
    """Make a pack last used `seconds` ago (its folder's mtime is its last use)."""
    then = time.time() - seconds
    os.utime(pack, (then, then))


def _change(hpc: Hpc, version: int) -> None:
    data = hpc.cwd / "data"
    data.mkdir(exist_ok=True)
    (data / "v.txt").write_text(f"version {version}")
    os.utime(data / "v.txt", (time.time() + version, time.time() + version))
    info = hpc.cwd.stat()
    for path in (data, data / "v.txt"):
        os.chown(path, info.st_uid, info.st_gid)


def _submit(hpc: Hpc, program: str) -> tuple[str, str]:
    """(job id, what hpclaunch said on stderr)."""
    proc = hpc.run("run", "--json", "--stage", "data", "--", "bash", "-c", program)
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["job_id"]), proc.stderr


def _wait_gone(hpc: Hpc, *jobs: str) -> None:
    deadline = time.monotonic() + 120
    while set(jobs) & set(hpc.cmd(["squeue", "-h", "-u", hpc.user, "-o", "%i"]).stdout.split()):
        assert time.monotonic() < deadline, f"jobs {jobs} still in squeue"
        time.sleep(0.5)


def test_pruning_spares_packs_of_queued_jobs_and_clean_empties_the_rest(hpc: Hpc) -> None:
    project = hpc.cwd / "hpclaunch.toml"
    project.write_text("[clusters.slurm]\nstage_cache_keep = 1\n")
    os.chown(project, hpc.cwd.stat().st_uid, hpc.cwd.stat().st_gid)
    _change(hpc, 1)
    busy, _ = _submit(hpc, "sleep 300")  # holds the first pack while it waits or runs
    [first] = _packs(hpc)
    _age(first, 3600)
    try:
        _change(hpc, 2)
        quick, said = _submit(hpc, "true")
        # Beyond stage_cache_keep = 1, long unused, but the sleeping job uses it.
        assert first.is_dir() and "stage cache: removed" not in said
        [second] = [p for p in _packs(hpc) if p != first]
        proc = hpc.run("cancel", busy)
        assert proc.returncode == 0, proc.stderr
        _wait_gone(hpc, busy, quick)
        _age(first, 3600)  # the job's guard used it when it unpacked: long ago, now
        _change(hpc, 3)
        busy, said = _submit(hpc, "sleep 300")
        # Now the first goes; the second stays: used minutes ago (a run may be starting).
        assert not first.exists() and second.is_dir(), said
        assert "stage cache: removed 1 older pack(s)" in said
        [third] = [p for p in _packs(hpc) if p != second]
        _age(second, 3600)
        _age(third, 3600)
        preview = hpc.run("clean", "--stage-cache", "--dry-run")
        assert preview.returncode == 0, preview.stderr
        assert preview.stdout, preview.stderr
        assert preview.stdout.splitlines()[0].startswith(f"would remove {second} (")
        assert "kept 1 pack(s) in use" in preview.stderr and str(third) in preview.stderr
        assert second.is_dir()
        proc = hpc.run("clean", "--stage-cache", "--json")
        assert proc.returncode == 0, proc.stderr
        done = json.loads(proc.stdout)
        assert done == {"dry_run": False, "removed": [str(second)], "kept": [str(third)]}
        assert _packs(hpc) == [third]
    finally:
        hpc.run("cancel", busy)


def test_a_pack_planted_by_another_user_is_never_unpacked(hpc: Hpc) -> None:
    """In a run root others can write (a group project folder), a second user plants
    the cache with a pack under the very name the victim's dataset hashes to (the key
    is computable from the listing). Today the victim's job unpacks the planted files;
    now the run stops before submission with one line naming the cache and the fix."""
    from hpclaunch.payload import stage

    _change(hpc, 1)
    runs = hpc.cwd / "runs"
    runs.mkdir(mode=0o777)
    runs.chmod(0o777)
    [item] = stage.plan_stage(["data"], hpc.cwd, runs)  # what the victim's run will look for
    pack = Path(item.archive)
    planted = hpc.cwd / "planted"
    planted.mkdir()
    (planted / "v.txt").write_text("planted by another user")
    pack.mkdir(parents=True)
    for index, names in ((0, ["."]), (1, ["v.txt"])):
        tar = ["tar", "-cf", str(pack / f"part-{index:02d}.tar"), "-C", str(planted)]
        subprocess.run([*tar, "--no-recursion", *names], check=True)
    other = pwd.getpwnam(testbed.OTHER_USER)
    for path in (pack.parent, pack, *pack.iterdir()):
        os.chown(path, other.pw_uid, other.pw_gid)
        path.chmod(0o777 if path.is_dir() else 0o666)
    out = hpc.folder("out")
    proc = hpc.run(
        "run", "--wait", "--stage", "data", "--", "bash", "-c",
        f'cp "$HPCLAUNCH_DATA/v.txt" {out}/seen.txt',
    )  # fmt: skip
    assert proc.returncode != 0
    assert not (out / "seen.txt").exists()
    assert f"the pack cache {pack.parent} is owned by uid {other.pw_uid}" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert hpc.runs() == []  # nothing submitted
