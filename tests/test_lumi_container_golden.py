"""LUMI container jobs: the Singularity command line of single- and multi-node jobs,
pinned by golden files and checked against shared/LUMI.md's bind list.

A fake is unavoidable here: Apptainer/Singularity cannot be installed on this machine
kind and LUMI's compute-node paths (/opt/cray, /var/spool/slurmd, libcxi) do not exist,
so this test renders the script without submitting it; the image is an empty file with
a SIF header standing in for /appl/local/containers/sif-images/<name>. The same command
lines run end to end on the testbed through tests/doubles/apptainer (a double that
accepts only Apptainer's documented grammar and runs the job with Charliecloud's ch-run):
tests/test_e2e_containers.py.

Regenerate after an intended change with:
    UPDATE_GOLDEN=1 pytest tests/test_lumi_container_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpclaunch.planning import preparing
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import render

GOLDEN = Path(__file__).parent / "golden"
LUMI_MD = Path(__file__).resolve().parents[2] / "shared" / "LUMI.md"
RUN_ID = "20260101-000000-000-abcd"
CWD = Path("/project/project_465000000/alice/llm")
IMAGE = "lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif"
SIF_DIR = "/appl/local/containers/sif-images"
MULTI_NODE = "/var/spool/slurmd,/opt/cray,/usr/lib64/libcxi.so.1"


def _script(tmp_path: Path, extra: dict[str, object]) -> str:
    images = tmp_path / "sif-images"
    images.mkdir()
    (images / IMAGE).write_bytes(b"#!/usr/bin/env run-singularity\nSIF_MAGIC0001" + b"\0" * 64)
    config_home = tmp_path / "config"
    profiles = config_home / "hpclaunch" / "clusters"
    profiles.mkdir(parents=True)
    # The site's image folder, moved here (the only change to the built-in lumi profile).
    (profiles / "lumi.toml").write_text(f'[container]\nimage_dirs = ["{images}"]\n')
    environ = {"USER": "alice", "HOME": "/users/alice", "PATH": "/usr/bin:/bin"}
    cli: dict[str, object] = {
        "cluster": "lumi",
        "account": "project_465000000",
        "time": "1:00:00",
        "container": IMAGE,
        **extra,
    }
    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(config_home)
    try:
        environ = {**environ, "XDG_CONFIG_HOME": str(config_home)}
        resolved = preparing.prepare_spec(cli, ("python", "train.py"), CWD, environ)
    finally:
        if old is None:
            del os.environ["XDG_CONFIG_HOME"]
        else:
            os.environ["XDG_CONFIG_HOME"] = old
    spec = resolved.spec
    run_dir = Path(spec.run_root) / spec.exp / RUN_ID
    paths = RunPaths(
        run_id=RUN_ID,
        run_dir=run_dir,
        checkpoint_dir=Path(spec.checkpoint_root) / spec.exp / RUN_ID / "checkpoints",
    )
    script = render.plan_batch(spec, resolved.profile, paths, CWD).script
    return script.replace(str(images), SIF_DIR)


CASES = {
    "lumi_container_1x2_small-g.sh": {"nodes": "1", "gpus_per_node": "2", "partition": "small-g"},
    "lumi_container_4x8_standard-g.sh": {
        "nodes": "4",
        "gpus_per_node": "8",
        "partition": "standard-g",
    },
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_container_script_matches_golden_file(name: str, tmp_path: Path) -> None:
    script = _script(tmp_path, CASES[name])
    golden = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(script, encoding="utf-8")
    assert script == golden.read_text(encoding="utf-8")


def _binds(text: str) -> str:
    line = next(x for x in text.splitlines() if x.startswith("#   singularity exec"))
    words = line.split()
    return words[words.index("--bind") + 1]


def test_single_node_binds_are_lumi_md_choices() -> None:
    """Single node: run directory, project directory, /pfs (the run root is on /scratch)."""
    text = (GOLDEN / "lumi_container_1x2_small-g.sh").read_text(encoding="utf-8")
    assert _binds(text) == (
        "/pfs,/scratch/project_465000000/alice/hpclaunch,"
        "/flash/project_465000000/alice/hpclaunch,/project/project_465000000/alice/llm"
    )
    assert MULTI_NODE.split(",")[0] not in text
    assert "libjansson" not in text


def test_multi_node_adds_lumi_md_set_literally() -> None:
    text = (GOLDEN / "lumi_container_4x8_standard-g.sh").read_text(encoding="utf-8")
    assert _binds(text).startswith(MULTI_NODE + ",/pfs,")
    assert "libjansson" not in text
    for line in (
        f"singularity exec --cleanenv --pwd {CWD}",
        f"{SIF_DIR}/{IMAGE} bash -c '$WITH_CONDA && exec \"$@\"' hpclaunch-activate python3 -I -S",
        "--hpclaunch-env-fd=3 python train.py",
        "export PYTHONNOUSERSITE=1",
    ):
        assert line in text, line
    # No GPU flag on LUMI (ROCm devices need none), and the environment is cleaned.
    assert "--nv" not in text and "--rocm" not in text


@pytest.mark.skipif(not LUMI_MD.is_file(), reason="shared/LUMI.md is not beside the repository")
def test_pinned_binds_are_the_ones_in_lumi_md() -> None:
    doc = LUMI_MD.read_text(encoding="utf-8")
    for path in MULTI_NODE.split(","):
        assert f"`{path}`" in doc, path
    assert "`/pfs`" in doc and SIF_DIR in doc and IMAGE in doc
    assert "no libjansson bind" in doc.lower()
