"""A bare `--container NAME` on a shared machine: looked up only in the profile's image
folders, never in the current folder where another user could have left an image of the
same name; `./NAME` takes that file, with a warning when it is not the user's. The
preview and the start name the file used (issue 24, item 6)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import testbed
from conftest import Hpc

pytestmark = pytest.mark.testbed


def _profile(hpc: Hpc, image_dir: Path) -> None:
    """The user's own local profile: Charliecloud, images in image_dir."""
    clusters = Path(hpc.env["XDG_CONFIG_HOME"]) / "hpclaunch" / "clusters"
    clusters.mkdir(parents=True)
    toml = clusters / "local.toml"
    toml.write_text(f'[container]\nruntime = "charliecloud"\nimage_dirs = ["{image_dir}"]\n')
    uid, gid = hpc.cwd.stat().st_uid, hpc.cwd.stat().st_gid
    for path in (clusters.parent, clusters, toml):
        os.chown(path, uid, gid)


def test_bare_image_name_ignores_an_image_planted_in_the_current_folder(
    hpc: Hpc, other: Hpc, user_image: Path
) -> None:
    name = user_image.name
    _profile(hpc, user_image.parent)
    # A group folder anyone of the group may write: the neighbour leaves an image there.
    hpc.cwd.chmod(0o777)
    planted = hpc.cwd / name
    done = other.cmd(["mkdir", "-m", "777", str(planted)])
    assert done.returncode == 0, done.stderr
    assert planted.stat().st_uid != hpc.cwd.stat().st_uid
    program = ("--", "python3", "-c", "print('IN', __import__('os').environ['RANK'])")

    proc = hpc.run("run", "--cluster", "local", "--dry-run", "--container", name, *program)
    assert proc.returncode == 0, proc.stderr
    task = next(x for x in proc.stdout.splitlines() if x.startswith("#   ch-run"))
    assert f" {user_image} -- " in task and str(planted) not in proc.stdout
    assert f"hpclaunch: container image {user_image} (found in the profile's image folder " in (
        proc.stderr
    )

    # Written with ./ it is that file, and the warning says whose it is.
    proc = hpc.run("run", "--cluster", "local", "--dry-run", "--container", f"./{name}", *program)
    assert proc.returncode == 0, proc.stderr
    assert f" {planted} -- " in proc.stdout
    assert f"hpclaunch: container image {planted}\n" in proc.stderr
    owner = f"is owned by {testbed.OTHER_USER} and writable by group and others: "
    assert f"warning: container image {planted} {owner}" in proc.stderr

    # A bare name the image folders lack: one line naming them and the fix.
    proc = hpc.run("run", "--cluster", "local", "--container", "nothere.sif", *program)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"image folders: {user_image.parent}" in proc.stderr
    assert "Write ./nothere.sif for a file in the current folder" in proc.stderr

    # A real start names the image before the run line; the record holds the path.
    proc = hpc.run("run", "--cluster", "local", "--container", name, *program)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert any(x.endswith("] IN 0") for x in proc.stdout.splitlines()), proc.stdout
    assert proc.stderr.index(f"container image {user_image}") < proc.stderr.index("run ")
    spec = json.loads((hpc.run_dirs()[-1] / "spec.json").read_text())
    assert spec["container"]["image"] == str(user_image)
