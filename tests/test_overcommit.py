"""--overcommit: Slurm's own option on the job and its step, more ranks than cores, and
the requests Slurm would still refuse refused before submission (issue 34)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from builders import cli_spec
from hpclaunch.config.options import RunOptions
from hpclaunch.config.profiles import NodeShape, Profile, load_profile
from hpclaunch.errors import UserError
from hpclaunch.planning.resources import MAX_TASKS_PER_NODE
from hpclaunch.planning.validate import validate
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script.render import plan_batch
from hpclaunch.slurm.sbatchargs import sbatch_args

SITE = Profile(name="site", kind="slurm", node=NodeShape(cpus=2))
ENV = {"USER": "alice", "PATH": "/usr/bin:/bin"}


def _site_spec(values: dict[str, Any]) -> Any:
    sources = {key: "cli" for key in values}
    return validate(SITE, RunOptions(**values), sources, ("python", "t.py"), ENV, False, "p")


def test_more_ranks_than_cores_need_overcommit() -> None:
    with pytest.raises(UserError) as info:
        _site_spec({"nodes": 2, "tasks_per_node": 40})
    assert "nodes have 2 usable cores" in info.value.line()
    spec = _site_spec({"nodes": 2, "tasks_per_node": 40, "overcommit": True})
    assert spec.overcommit and spec.ntasks == 80


def test_overcommit_reaches_sbatch_and_the_step(tmp_path: Path) -> None:
    spec = cli_spec({"nodes": 2, "tasks_per_node": 40, "overcommit": True}, "slurm")
    run = tmp_path / "run"
    batch = plan_batch(spec, load_profile("slurm"), RunPaths("r1", run, run / "ckpt"), tmp_path)
    assert "#SBATCH --overcommit\n" in batch.script
    # Slurm 22.05 refuses --ntasks-per-node=40 on 2-core nodes even with --overcommit:
    # the job asks for its total, the step places 40 per node.
    assert "#SBATCH --ntasks=80\n" in batch.script
    assert "#SBATCH --ntasks-per-node" not in batch.script
    assert "--ntasks-per-node=40" in batch.srun_argv
    assert "--overcommit" in batch.srun_argv
    plain = cli_spec({"nodes": 2}, "slurm")
    batch = plan_batch(plain, load_profile("slurm"), RunPaths("r2", run, run / "ckpt"), tmp_path)
    assert "--overcommit" not in batch.script


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"tasks_per_node": MAX_TASKS_PER_NODE + 1, "overcommit": True},
            f"--tasks-per-node: {MAX_TASKS_PER_NODE + 1} tasks per node with --overcommit "
            f"(Slurm starts at most {MAX_TASKS_PER_NODE}",
        ),
        (
            {"tasks_per_node": 8, "overcommit": True, "launcher": "torchrun"},
            "--overcommit: with --launcher torchrun",
        ),
    ],
)
def test_what_slurm_would_refuse_is_refused_first(values: dict[str, Any], expected: str) -> None:
    with pytest.raises(UserError) as info:
        _site_spec(values)
    text = info.value.line()
    assert expected in text and "\n" not in text


@pytest.mark.parametrize("raw", ["-O", "--overcommit"])
def test_the_raw_sbatch_spelling_names_the_option(raw: str) -> None:
    with pytest.raises(UserError) as info:
        sbatch_args((raw,))
    assert "--overcommit" in info.value.line()


def test_a_local_run_notes_overcommit_as_slurm_only() -> None:
    from hpclaunch.planning.preparing import _local_notes

    assert "--overcommit" in _local_notes({"overcommit": "cli"})[0]
