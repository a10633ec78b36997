"""The node-local folder's logic without Slurm (issue 24 item 1): the bootstrap of local
rank 0 makes it (fresh, 0700, a name nobody can guess) when no staging guard did, the
other ranks of the node find the same one, every variable holding the placeholder points
into it, and the maker removes it once the others have let go; --stage-out refuses a
source that is a symlink or leads out of the folder. The testbed's two nodes, with a
second user planting, are tests/test_e2e_nodelocal.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hpclaunch import node
from hpclaunch.node import stage_guard

BOOTSTRAP = Path(node.__file__).with_name("bootstrap.py")


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hpclaunch_bootstrap_nodelocal", BOOTSTRAP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bs = _load()


def _env(tmp_path: Path, local_rank: str) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "42",
        "LOCAL_RANK": local_rank,
        node.HPCLAUNCH_LOCAL: node.LOCAL_UNSET,
        node.HPCLAUNCH_LOCAL_PARENT: str(tmp_path / "tmp"),
        node.HPCLAUNCH_LOCAL_RECORD: str(tmp_path / "run" / node.LOCAL_RECORDS),
        "MIOPEN_USER_DB_PATH": node.LOCAL_UNSET + "/miopen",
        "HPCLAUNCH_DATA_X": node.LOCAL_UNSET + "/data/X",
        "OTHER": "untouched",
    }


def test_local_rank_0_makes_a_private_folder_the_other_ranks_share(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    (tmp_path / "run").mkdir()
    planted = tmp_path / "tmp" / "hpcuser-hpclaunch-42"  # the old predictable name
    planted.mkdir()
    first, second = _env(tmp_path, "0"), _env(tmp_path, "1")
    local, lock, made = bs.node_local(first, "nodeA")
    assert made and lock >= 0
    folder = Path(local)
    assert folder.parent == tmp_path / "tmp" and folder.name.startswith("hpclaunch-42.")
    assert len(folder.name) > len("hpclaunch-42.") + 8  # random part: nobody can guess it
    assert folder.stat().st_mode & 0o777 == 0o700 and folder != planted
    record = tmp_path / "run" / node.LOCAL_RECORDS / "nodeA.42"
    assert record.read_text() == local and record.stat().st_mode & 0o777 == 0o600
    assert record.parent.stat().st_mode & 0o777 == 0o700
    assert first[node.HPCLAUNCH_LOCAL] == local
    assert first["MIOPEN_USER_DB_PATH"] == local + "/miopen"
    assert first["HPCLAUNCH_DATA_X"] == local + "/data/X" and first["OTHER"] == "untouched"
    other_local, other_lock, other_made = bs.node_local(second, "nodeA")
    assert (other_local, other_made) == (local, False)
    assert second["MIOPEN_USER_DB_PATH"] == local + "/miopen"
    # The maker (here in a process of its own: flock locks belong to the open file, and
    # one process holding both would never wait) waits for the other rank's shared lock.
    os.close(lock)
    remover = subprocess.Popen(
        [sys.executable, "-c", _REMOVE, str(BOOTSTRAP), local, str(record)],
        stderr=subprocess.PIPE,
    )
    with pytest.raises(subprocess.TimeoutExpired):
        remover.wait(timeout=1.0)
    assert folder.is_dir()
    os.close(other_lock)  # the other rank ends
    assert remover.wait(timeout=30) == 0, remover.stderr.read() if remover.stderr else ""
    assert not folder.exists() and not record.exists()
    assert planted.is_dir()  # never touched, never used


# The maker's end: it holds its shared lock, then removes the folder when it may.
_REMOVE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("b", sys.argv[1])
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)
local, record = sys.argv[2], sys.argv[3]
env = {"SLURM_JOB_ID": "42", b.HPCLAUNCH_LOCAL_RECORD: record.rsplit("/", 1)[0]}
import fcntl, os
lock = os.open(local + "/" + b.LOCAL_LOCK, os.O_RDWR)
fcntl.flock(lock, fcntl.LOCK_SH)
b.remove_local(env, local, lock, "nodeA")
"""


def test_without_the_placeholder_nothing_is_made(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "42", "LOCAL_RANK": "0", node.HPCLAUNCH_LOCAL: str(tmp_path)}
    assert bs.node_local(env, "nodeA") == ("", -1, False)
    assert env[node.HPCLAUNCH_LOCAL] == str(tmp_path)


def test_stage_out_refuses_a_symlinked_source_or_one_leading_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local, outside = tmp_path / "local", tmp_path / "victim"
    local.mkdir(mode=0o700)
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (local / "out").symlink_to(outside)  # the source itself a link
    (local / "via").symlink_to(outside)  # a source under a link: resolves outside
    (local / "fine").mkdir()
    (local / "fine" / "r.txt").write_text("result")
    spec = {
        "nodes": 1,
        "stage_out": [
            ["out", str(tmp_path / "d1")],
            ["via/secret.txt", str(tmp_path / "d2")],
            ["fine", str(tmp_path / "d3")],
        ],
    }
    assert stage_guard.stage_out(spec, str(local), "nodeA") is False
    assert not (tmp_path / "d1").exists() and not (tmp_path / "d2").exists()
    assert (tmp_path / "d3" / "r.txt").read_text() == "result"
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "leads out" in ln]
    assert len(lines) == 2, lines


def test_a_step_of_an_allocation_gets_the_placeholder_for_lumis_caches(tmp_path: Path) -> None:
    """Inside an allocation (the step backend) the batch script's lines are not run:
    the step's environment carries the placeholder and where to make the folder, so
    MIOpen's cache still lands in the node's private folder, not at "/miopen"."""
    from hpclaunch.backends.base import Launch
    from hpclaunch.backends.step import step_env
    from hpclaunch.planning import preparing
    from hpclaunch.records.runpaths import RunPaths
    from hpclaunch.script import render

    environ = {"USER": "alice", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    cli: dict[str, object] = {"cluster": "lumi", "nodes": "1", "gpus_per_node": "2"}
    cli.update(partition="small-g", account="project_465000000", time="10")
    resolved = preparing.prepare_spec(cli, ("python", "train.py"), tmp_path, environ)
    paths = RunPaths(run_id="r", run_dir=tmp_path / "run", checkpoint_dir=tmp_path / "c")
    plan = render.plan_batch(resolved.spec, resolved.profile, paths, tmp_path)
    launch = Launch(resolved.spec, plan, paths, tmp_path, {**environ, "SLURM_JOB_ID": "9"})
    env = step_env(launch)
    assert env["MIOPEN_USER_DB_PATH"] == node.LOCAL_UNSET + "/miopen"
    assert env[node.HPCLAUNCH_LOCAL_RECORD] == str(tmp_path / "run" / node.LOCAL_RECORDS)
    assert env[node.HPCLAUNCH_LOCAL_PARENT] == "/tmp"
