"""A packed venv (`hpclaunch env pack`, `--venv FILE.sqsh`) with the runtimes srun enters
(issue 33 with issue 32's Pyxis and CSCS Container Engine), without Slurm: the mount form
each runtime takes, in the job script and the run's EDF.

- The CE mounts the SquashFS file itself: an EDF mount `FILE:PATH:sqsh` (github.com/
  eth-cscs/cscs-docs docs/software/container-engine/edf.md, "mounts"), no squashfuse on
  the nodes, no bind of the venv's path.
- Pyxis binds only (`--container-mounts`, github.com/NVIDIA/pyxis README "Usage"): each
  node mounts the file with squashfuse (node/venv_mount.py) and the mount is bound in.
The testbed runs both through the stand-in (tests/test_e2e_runtimes.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from hpclaunch.node import VENV_MOUNT, VENV_RECORD
from hpclaunch.payload import venvpack
from hpclaunch.payload.venvs import image_identity
from test_runtimes import RUN_ID, _plan, _srun
from test_runtimes import site as site

pytestmark = pytest.mark.skipif(not shutil.which("mksquashfs"), reason="no squashfs-tools")


def _packed_for_the_image(root: Path) -> tuple[Path, Path]:
    """A venv made for the site's pytorch.sqsh (its record names it), packed; the folder
    removed, as on a site where only the image travels."""
    sqsh = str(root / "images" / "pytorch.sqsh")
    venv = root / "venvs" / "torch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    record = {"image": sqsh, "image_id": image_identity(sqsh)}
    (venv / VENV_RECORD).write_text(json.dumps(record))
    image = venvpack.pack(venv, None)
    shutil.rmtree(venv)
    return venv, image


def test_the_ce_mounts_a_packed_venv_itself_through_the_edf(site: Path) -> None:
    venv, image = _packed_for_the_image(site)
    plan = _plan(site, "ce", venv=str(image))
    (name, text), *_ = plan.files
    assert name == "container.toml"
    mounts = tomllib.loads(text)["mounts"]
    assert f"{image}:{venv}:sqsh" in mounts  # the CE's SquashFS mount at the venv's path
    assert not any(m.startswith(f"{venv}:") for m in mounts)  # no bind of the path
    assert VENV_MOUNT not in plan.script and "squashfuse" not in plan.script
    assert f"export HPCLAUNCH_VENV={venv}" in plan.script  # sys.prefix: the original path


def test_pyxis_binds_the_venv_each_node_mounted_with_squashfuse(site: Path) -> None:
    venv, image = _packed_for_the_image(site)
    plan = _plan(site, "pyxis", venv=str(image))
    mounts = next(a for a in _srun(plan) if a.startswith("--container-mounts="))
    assert f"{venv}:{venv}" in mounts.split("=", 1)[1].split(",")
    assert str(image) not in mounts  # Pyxis has no SquashFS mount: the node's is bound
    lines = plan.script.splitlines()
    mount = next(line for line in lines if VENV_MOUNT in line)
    assert mount.startswith("srun --overlap ") and f"{image} {venv} " in mount
    ranks = next(i for i, line in enumerate(lines) if "--container-image=" in line)
    assert lines.index(mount) < ranks  # mounted on every node before the ranks start
    assert plan.files == ()
    assert RUN_ID in plan.script
