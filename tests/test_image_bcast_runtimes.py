"""A container image file broadcast with sbcast (issue 33, section 2) for the two runtimes
srun enters itself: from image_broadcast_min_nodes (default 8) on, Pyxis's
--container-image and the CE's EDF `image` name each node's copy ($HPCLAUNCH_IMAGE, the
shared file where sbcast is missing or refused: node/stage_bcast.py prints it), below it
the lines stay today's. On the testbed (through the SPANK stand-in):
tests/test_e2e_runtimes.py::test_the_ranks_run_the_node_local_copy_of_the_image."""

from __future__ import annotations

from pathlib import Path

import tomllib

from hpclaunch.basics import shell
from hpclaunch.script import render
from test_image_broadcast import _lines
from test_runtimes import _attach_plan, _plan, _srun
from test_runtimes import site as site

COPY_FLAG = '--container-image="${HPCLAUNCH_IMAGE}"'


def _srun_line(script: str) -> tuple[int, str]:
    """The ranks' srun line (joined from its continuation lines) and where it starts."""
    lines = script.splitlines()
    start = lines.index("srun \\")
    end = start
    while lines[end].endswith("\\"):
        end += 1
    return start, " ".join(line.strip(" \\") for line in lines[start : end + 1])


def _words(plan: render.BatchPlan) -> list[str]:
    """The ranks' srun line as the script writes it, but for the node count."""
    return [shell.word(w).replace("--nodes=8", "--nodes=7") for w in plan.srun_argv]


def test_pyxis_ranks_name_the_node_local_copy_from_the_profiles_node_count(site: Path) -> None:
    image = str(site / "images" / "pytorch.sqsh")
    today = _plan(site, "pyxis", container=image, nodes="7")
    assert f"--container-image={image}" in _srun(today)
    assert "HPCLAUNCH_IMAGE" not in today.script and "stage_bcast" not in today.script
    plan = _plan(site, "pyxis", container=image, nodes="8")
    lines = plan.script.splitlines()
    [send] = _lines(plan.script, "stage_bcast.py - ")
    assert lines[send].startswith("HPCLAUNCH_IMAGE=$(") and f" --container {image})" in lines[send]
    assert lines[send + 1] == f'[ -n "$HPCLAUNCH_IMAGE" ] || HPCLAUNCH_IMAGE={image}'
    start, srun = _srun_line(plan.script)
    assert send < start and COPY_FLAG in srun and image not in srun
    # Only the image changes: the other flags, the task and the ranks' environment stay.
    shared = f"--container-image={image}"
    assert _words(plan) == [COPY_FLAG if w == shared else w for w in _words(today)]
    assert "export HPCLAUNCH_IMAGE" not in plan.script  # srun's shell expands it
    [drop] = _lines(plan.script, "stage_bcast.py --drop")
    assert drop > start and "--ntasks-per-node=1" in lines[drop]
    assert "each node's copy sent by sbcast" in plan.script


def test_ce_edf_names_the_node_local_copy_from_the_profiles_node_count(site: Path) -> None:
    image = str(site / "images" / "pytorch.sqsh")
    today = _plan(site, "ce", container=image, nodes="7")
    old = tomllib.loads(today.files[0][1])
    assert old["image"] == image and "HPCLAUNCH_IMAGE" not in today.script + today.files[0][1]
    assert "stage_bcast" not in today.script
    plan = _plan(site, "ce", container=image, nodes="8")
    (name, text), *_ = plan.files
    edf = tomllib.loads(text)
    # The CE expands ${VAR} in every EDF parameter, the image too (cscs-docs edf.md).
    assert name == "container.toml" and edf["image"] == "${HPCLAUNCH_IMAGE}"
    assert {**edf, "image": image} == old  # nothing else changes
    assert f'each node\'s copy of "{image}" (sbcast)' in text
    lines = plan.script.splitlines()
    [send] = _lines(plan.script, "stage_bcast.py - ")
    assert lines[send].startswith("HPCLAUNCH_IMAGE=$(") and f" --container {image})" in lines[send]
    assert lines[send + 1] == f'[ -n "$HPCLAUNCH_IMAGE" ] || HPCLAUNCH_IMAGE={image}'
    assert lines[send + 2] == "export HPCLAUNCH_IMAGE"  # srun's environment: the CE's host
    start, _ = _srun_line(plan.script)
    assert send < start and _words(plan) == _words(today)  # the same --environment=EDF
    [drop] = _lines(plan.script, "stage_bcast.py --drop")
    assert drop > start


def test_attach_to_a_ce_job_names_the_shared_image(tmp_path: Path) -> None:
    """attach --container runs a step of its own with the run's EDF: its ${HPCLAUNCH_IMAGE}
    is the shared file there (an undefined variable is an error for the CE)."""
    ce = _attach_plan(tmp_path / "ce", "ce", "/img/x.sqsh", ["true"])
    assert ce.env["HPCLAUNCH_IMAGE"] == "/img/x.sqsh"
    pyxis = _attach_plan(tmp_path / "pyxis", "pyxis", "/img/x.sqsh", ["true"])
    assert "HPCLAUNCH_IMAGE" not in pyxis.env
