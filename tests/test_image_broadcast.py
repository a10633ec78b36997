"""A container image file broadcast with sbcast (issue 33, section 2): on more than one
node the batch script sends the image once to every node's local folder
(node/stage_bcast.py --container), the ranks' container command names the copy
($HPCLAUNCH_IMAGE, the shared file where sbcast is missing or refused) and a step after
the ranks removes it (the stage guards do with --stage). A directory image and a
one-node job are not broadcast. The bytes read on the testbed:
tests/test_e2e_venvpack.py::test_a_charliecloud_image_file_is_read_once_with_sbcast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch.config.profiles import Profile
from hpclaunch.errors import UserError
from hpclaunch.node import stage_bcast, stage_guard
from test_broadcast import REFUSED, SBCAST, _bin
from test_runtimes import _plan, _srun
from test_runtimes import site as site

IMAGE_WORD = '"${HPCLAUNCH_IMAGE}"'


def _lines(script: str, needle: str) -> list[int]:
    return [i for i, line in enumerate(script.splitlines()) if needle in line]


def test_the_ranks_run_the_node_local_copy_of_an_image_file(site: Path) -> None:
    image = str(site / "images" / "pytorch.sqsh")
    plan = _plan(site, "apptainer", container=image, nodes="8")  # image_broadcast_min_nodes
    lines = plan.script.splitlines()
    send = _lines(plan.script, "stage_bcast.py")[0]
    assert lines[send].startswith("HPCLAUNCH_IMAGE=$(") and lines[send].endswith(f"{image})")
    assert f" --container {image}" in lines[send]
    assert lines[send + 1] == f'[ -n "$HPCLAUNCH_IMAGE" ] || HPCLAUNCH_IMAGE={image}'
    # The ranks' command names the copy, not the shared file.
    argv = _srun(plan)
    assert "HPCLAUNCH_IMAGE" in str(argv) and image not in argv
    [rank] = _lines(plan.script, "hpclaunch-task apptainer exec")
    assert IMAGE_WORD in lines[rank] and image not in lines[rank] and send < rank
    # After the ranks, one task per node removes this node's copies.
    [drop] = _lines(plan.script, "stage_bcast.py --drop")
    assert drop > rank and "--ntasks-per-node=1" in lines[drop]
    assert lines[-1] == 'exit "$HPCLAUNCH_RC"'


def test_one_node_and_a_directory_image_are_not_broadcast(site: Path) -> None:
    image = str(site / "images" / "pytorch.sqsh")
    for plan in (
        _plan(site, "apptainer", container=image, nodes="1"),
        _plan(site, "charliecloud", container=str(site / "images" / "rootfs"), nodes="8"),
    ):
        assert "HPCLAUNCH_IMAGE" not in plan.script and "stage_bcast" not in plan.script


def test_an_image_is_broadcast_from_the_profiles_node_count_on(site: Path) -> None:
    """image_broadcast_min_nodes (default 8): sbcast reads the whole file, each node's
    runtime only the blocks it touches, so fewer nodes read the image per node; the
    staged data's broadcast is unchanged. A project file's [clusters.NAME] lowers it."""
    image = str(site / "images" / "pytorch.sqsh")
    data = site / "data"
    data.mkdir()
    (data / "x.txt").write_text("x")
    for nodes, sent in (("7", False), ("8", True)):
        plan = _plan(site, "apptainer", container=image, nodes=nodes)
        assert ("HPCLAUNCH_IMAGE" in plan.script) is sent, nodes
        assert ("stage_bcast" in plan.script) is sent, nodes
        assert (image in _srun(plan)) is not sent, nodes
    staged = _plan(site, "apptainer", container=image, nodes="7", stage=(str(data),))
    [send] = _lines(staged.script, "stage_bcast.py")
    assert "--container" not in staged.script.splitlines()[send]  # the data only
    assert "HPCLAUNCH_IMAGE" not in staged.script
    (site / "project").mkdir(exist_ok=True)
    (site / "project" / "hpclaunch.toml").write_text(
        "[clusters.gpusite]\nimage_broadcast_min_nodes = 2\n"
    )
    assert "HPCLAUNCH_IMAGE" in _plan(site, "apptainer", container=image).script
    with pytest.raises(UserError) as info:
        Profile.model_validate({"name": "s", "image_broadcast_min_nodes": 0})
    assert "image_broadcast_min_nodes: 0 is not a node count" in info.value.line()


def test_with_staging_the_guards_remove_the_copy(site: Path) -> None:
    data = site / "data"
    data.mkdir()
    (data / "x.txt").write_text("x")
    plan = _plan(site, "apptainer", container=str(site / "images" / "pytorch.sqsh"),
                 stage=(str(data),), nodes="8")  # fmt: skip
    assert "stage_bcast.py --drop" not in plan.script
    assert _lines(plan.script, "stage_bcast.py")[0] < _lines(plan.script, "stage_node.py run")[0]


def _send(tmp_path: Path, path: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "local-parent").mkdir(exist_ok=True)
    env = {
        "PATH": path,
        "SLURM_JOB_ID": "42",
        "HPCLAUNCH_LOCAL_PARENT": str(tmp_path / "local-parent"),
    }
    return subprocess.run(
        [sys.executable, "-I", "-S", stage_bcast.__file__, *args],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_the_image_is_sent_and_its_copy_printed_then_dropped(tmp_path: Path) -> None:
    image = tmp_path / "image.sif"
    image.write_bytes(b"SIF" * 1000)
    sent_map = str(tmp_path / "broadcast.json")
    done = _send(tmp_path, _bin(tmp_path, SBCAST), "-", sent_map, "--container", str(image))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    copy = done.stdout.strip()
    assert os.path.basename(copy).startswith("hpclaunch-bcast-42.")
    assert Path(copy).read_bytes() == image.read_bytes()
    assert json.loads(Path(sent_map).read_text()) == {str(image): copy}
    # The stage guard (with --stage) counts the image among the copies it removes.
    found = stage_guard.broadcast_copies({stage_guard.HPCLAUNCH_STAGE_BCAST: sent_map})
    assert found == {str(image): copy}
    # An earlier attempt's copy of this job (--requeue) goes too; another job's stays.
    earlier, other = (tmp_path / "local-parent" / f"hpclaunch-bcast-{j}.ab.0" for j in (42, 43))
    earlier.write_bytes(b"x")
    other.write_bytes(b"x")
    done = _send(tmp_path, os.environ["PATH"], "--drop", sent_map)
    assert done.returncode == 0 and not os.path.exists(copy) and image.exists()
    assert not earlier.exists() and other.exists()


def test_a_refused_sbcast_leaves_the_shared_image_with_a_note(tmp_path: Path) -> None:
    image = tmp_path / "image.sqfs"
    image.write_bytes(b"hsqs" + b"\0" * 100)
    sent_map = str(tmp_path / "broadcast.json")
    done = _send(tmp_path, _bin(tmp_path, REFUSED), "-", sent_map, "--container", str(image))
    assert done.returncode == 0 and done.stdout == f"{image}\n"
    assert done.stderr.startswith(f"hpclaunch: note: sbcast of {image} refused")
    bare = tmp_path / "nobin"
    bare.mkdir()
    done = _send(tmp_path, str(bare), "-", sent_map, "--container", str(image))
    assert done.stdout == f"{image}\n" and "no sbcast here" in done.stderr
