"""LUMI's GPU partitions: every job there is a GPU job, one task per GCD.

A newcomer's `hpclaunch run --cluster lumi -p small-g` (or `-p dev-g`) used to give a
CPU-only job: one task, one CPU, no GPU, no memory request. Now the partition's data
(lumi.toml: whole_node, gpus_default) decides: standard-g takes whole nodes (8 GCDs),
small-g and dev-g parts of nodes (1 GCD unless asked for more, 8 with --exclusive);
each GCD gets its task with 7 CPUs and --mem-per-gpu=60G (shared/LUMI.md "Choices for
the lumi profile"). CPU masks only where the job owns the node and runs 8 tasks there.
The dry-run says what was defaulted and which time limit Slurm applies without -t.

A fake is unavoidable, as in tests/test_lumi_golden.py: LUMI's partitions cannot be
reproduced on the testbed, so these render the script without submitting it.

Regenerate the golden files after an intended change with:
    UPDATE_GOLDEN=1 pytest tests/test_lumi_partitions.py
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import pytest

from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profiles import load_profile
from hpclaunch.errors import UserError
from hpclaunch.planning import preparing
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import defaultnotes, render
from hpclaunch.slurm import discover
from test_lumi_golden import CWD, ENVIRON, LUMI_MD, MASKS, RUN_ID
from test_lumi_golden import GOLDEN as STANDARD_GOLDEN

GOLDEN = Path(__file__).parent / "golden"
SRC = Path(__file__).resolve().parents[1] / "src" / "hpclaunch"
MEM_60G = 60 * 1024


def _plan(
    extra: dict[str, object], environ: Optional[dict[str, str]] = None
) -> tuple[JobSpec, render.BatchPlan]:
    """A 1-node job as the command line gives it (values are CLI strings)."""
    cli: dict[str, object] = {"cluster": "lumi", "account": "project_465000000", **extra}
    resolved = preparing.prepare_spec(cli, ("python", "train.py"), CWD, environ or ENVIRON)
    spec = resolved.spec
    paths = RunPaths(
        run_id=RUN_ID,
        run_dir=Path(spec.run_root) / spec.exp / RUN_ID,
        checkpoint_dir=Path(spec.checkpoint_root) / spec.exp / RUN_ID / "checkpoints",
    )
    return spec, render.plan_batch(spec, resolved.profile, paths, CWD)


def _said(extra: dict[str, object], environ: Optional[dict[str, str]] = None) -> str:
    """The dry-run's comment lines as one text (a note may wrap over several lines)."""
    text = render.preview(_plan(extra, environ)[1], {})
    return " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))


def _shape(spec: JobSpec) -> tuple[Any, ...]:
    return (
        spec.gpus_per_node,
        spec.tasks_per_node,
        spec.cpus_per_task,
        spec.mem_per_gpu_mb,
        spec.mem_mb,
    )


# -- the job's shape -------------------------------------------------------------------


@pytest.mark.parametrize("partition", ["small-g", "dev-g"])
def test_partial_node_partitions_give_one_gcd_job(partition: str) -> None:
    spec, _ = _plan({"partition": partition})
    assert _shape(spec) == (1, 1, 7, MEM_60G, None)
    assert spec.cpu_bind == ""  # one task: only the first mask would apply (LUMI.md)


@pytest.mark.parametrize("partition", ["small-g", "dev-g"])
def test_exclusive_takes_the_whole_node_and_binds_like_standard_g(partition: str) -> None:
    spec, _ = _plan({"partition": partition, "exclusive": True})
    standard, _ = _plan({"partition": "standard-g"})
    assert _shape(spec) == _shape(standard) == (8, 8, 7, MEM_60G, None)
    assert spec.cpu_bind == standard.cpu_bind == f"verbose,mask_cpu:{MASKS}"


def test_more_gcds_on_small_g_get_tasks_but_no_mask() -> None:
    spec, plan = _plan({"partition": "small-g", "gpus_per_node": "2"})
    assert _shape(spec) == (2, 2, 7, MEM_60G, None)
    assert spec.cpu_bind == "" and "--cpu-bind" not in plan.script
    # --exclusive with fewer than 8 tasks: masks need 8 tasks per node (LUMI.md).
    spec, _ = _plan({"partition": "small-g", "gpus_per_node": "2", "exclusive": True})
    assert (spec.tasks_per_node, spec.cpu_bind) == (2, "")


@pytest.mark.parametrize(
    ("extra", "mem_mb", "mem_per_gpu_mb"),
    [
        ({"mem": "100G"}, 100 * 1024, None),
        ({"mem": "0"}, 0, None),
        ({"mem_per_gpu": "32G"}, None, 32 * 1024),
    ],
)
def test_the_users_memory_wins(
    extra: dict[str, object], mem_mb: Optional[int], mem_per_gpu_mb: Optional[int]
) -> None:
    spec, _ = _plan({"partition": "small-g", **extra})
    assert (spec.mem_mb, spec.mem_per_gpu_mb) == (mem_mb, mem_per_gpu_mb)


def test_zero_gpus_asked_for_is_a_cpu_job() -> None:
    spec, _ = _plan({"partition": "small-g", "gpus_per_node": "0"})
    assert _shape(spec) == (0, 1, 1, None, None)


def test_nine_gcds_are_refused_naming_the_field_and_the_limit() -> None:
    with pytest.raises(UserError) as info:
        _plan({"partition": "small-g", "gpus_per_node": "9"})
    assert info.value.line() == (
        "hpclaunch: error: --gpus-per-node: 9 GPUs per node (nodes of small-g have 8). "
        "Ask for 8 or fewer"
    )


def test_the_default_is_partition_data_not_partition_names(tmp_path: Path) -> None:
    """A partial-node partition a site adds gets 1 GPU (or its gpus_default); no module
    names LUMI's partitions."""
    clusters = tmp_path / "cfg" / "hpclaunch" / "clusters"
    clusters.mkdir(parents=True)
    (clusters / "lumi.toml").write_text(
        "[partitions.part-g]\nmax_time = '1:00:00'\n"
        "[partitions.pair-g]\nmax_time = '1:00:00'\ngpus_default = 2\n"
    )
    environ = {**ENVIRON, "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    assert _plan({"partition": "part-g"}, environ)[0].gpus_per_node == 1
    assert _shape(_plan({"partition": "pair-g"}, environ)[0]) == (2, 2, 7, MEM_60G, None)
    for module in (
        "planning/resources.py",
        "planning/validate.py",
        "script/render.py",
        "script/defaultnotes.py",
    ):
        text = (SRC / module).read_text(encoding="utf-8")
        assert "small-g" not in text and "dev-g" not in text, module


# -- what the dry-run says -------------------------------------------------------------


@pytest.mark.parametrize("partition", ["small-g", "dev-g"])
def test_preview_names_the_default_and_how_to_ask_for_more(partition: str) -> None:
    text = _said({"partition": partition, "time": "10"})
    assert (
        f"{partition} allocates parts of nodes: 1 GPU per node by default (one rank with "
        "7 CPUs and 60G per GPU); ask for more with --gpus-per-node N (up to 8) or take "
        "whole nodes with --exclusive (all 8 GPUs, ranks bound to their GPUs' cores)"
    ) in text
    assert "no -t/--time" not in text
    # Asked for: nothing to explain.
    assert "by default" not in _said({"partition": partition, "gpus_per_node": "2"})


def test_preview_of_exclusive_and_whole_node_defaults() -> None:
    text = _said({"partition": "small-g", "exclusive": True})
    assert "--exclusive takes whole nodes of small-g: all 8 GPUs per node by default" in text
    text = _said({"partition": "standard-g"})
    assert "standard-g allocates whole nodes: all 8 GPUs per node by default" in text


@pytest.mark.parametrize(("partition", "most"), [("small-g", "3-00:00:00"), ("dev-g", "03:00:00")])
def test_preview_without_time_states_the_partitions_rule(partition: str, most: str) -> None:
    """No DefaultTime in the profile (LUMI.md gives none): Slurm's applies, and where to
    see it; the partition's maximum is named."""
    text = _said({"partition": partition})
    assert (
        f"no -t/--time: Slurm applies {partition}'s DefaultTime (scontrol show partition "
        f"{partition} shows it; "
    ) in text
    assert f"without one, its MaxTime, {most}); ask for up to {most} with -t TIME" in text


def test_preview_names_a_known_default_time(tmp_path: Path) -> None:
    clusters = tmp_path / "cfg" / "hpclaunch" / "clusters"
    clusters.mkdir(parents=True)
    (clusters / "lumi.toml").write_text("[partitions.dev-g]\ndefault_time = '30'\n")
    environ = {**ENVIRON, "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    text = _said({"partition": "dev-g"}, environ)
    assert (
        "no -t/--time: Slurm gives the job dev-g's default time limit, 00:30:00; "
        "ask for up to 03:00:00 with -t TIME"
    ) in text


def test_sinfo_default_time_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    out = "gpu*|2-00:00:00|4|64|gpu:8|480000|1-4|0|1:00:00\ncpu|1:00|2|8|(null)|1000|1-2|0|n/a\n"
    monkeypatch.setattr(discover, "_run", lambda argv: out if "%L" in argv[-1] else None)
    discover.partitions.cache_clear()
    try:
        found = discover.partitions()
    finally:
        discover.partitions.cache_clear()
    assert (found["gpu"].default_time, found["gpu"].max_time) == (3600, 2 * 86400)
    assert (found["cpu"].default_time, found["cpu"].max_time) == (None, 60)


def test_local_runs_get_no_partition_notes() -> None:
    profile = load_profile("local")
    spec = JobSpec(cluster="local", program=("x",))
    assert defaultnotes.default_notes(spec, profile) == []


# -- golden files ----------------------------------------------------------------------

CASES: dict[str, dict[str, object]] = {
    "lumi_1x1_small-g.sh": {"partition": "small-g"},
    "lumi_1x1_dev-g.sh": {"partition": "dev-g"},
    "lumi_1x8_small-g_exclusive.sh": {"partition": "small-g", "exclusive": True, "time": "1:00:00"},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_script_matches_golden_file(name: str) -> None:
    script = _plan(CASES[name])[1].script
    golden = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(script, encoding="utf-8")
    assert script == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["lumi_1x1_small-g.sh", "lumi_1x1_dev-g.sh"])
def test_partial_node_golden_files_hold_a_one_gcd_job(name: str) -> None:
    text = (GOLDEN / name).read_text(encoding="utf-8")
    for line in (
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --cpus-per-task=7",
        "#SBATCH --mem-per-gpu=60G",
        "    --cpus-per-task=7 \\",
    ):
        assert line in text, line
    assert "--cpu-bind" not in text and "#SBATCH --time" not in text


def test_exclusive_golden_file_binds_as_standard_g() -> None:
    text = (GOLDEN / "lumi_1x8_small-g_exclusive.sh").read_text(encoding="utf-8")
    for line in (
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=7",
        "#SBATCH --mem-per-gpu=60G",
        "#SBATCH --partition=small-g",
        "#SBATCH --exclusive",
        f"    --cpu-bind=verbose,mask_cpu:{MASKS} \\",
    ):
        assert line in text, line
    bind = [x for x in text.splitlines() if "--cpu-bind" in x]
    standard = STANDARD_GOLDEN.read_text(encoding="utf-8").splitlines()
    assert bind == [x for x in standard if "--cpu-bind" in x]


@pytest.mark.skipif(not LUMI_MD.is_file(), reason="shared/LUMI.md is not beside the repository")
def test_partition_facts_are_the_ones_in_lumi_md() -> None:
    doc = " ".join(LUMI_MD.read_text(encoding="utf-8").split())
    for fact in (
        "`standard-g` always allocates whole nodes",
        "`small-g` allows partial nodes",
        "CPU binding masks only make sense on full nodes or `--exclusive`",
        "they need 8 tasks per node",
        "`dev-g` for short debugging",
        "--mem-per-gpu=60G",
        "--cpus-per-task=7",
    ):
        assert fact in doc, fact
    lumi = load_profile("lumi")
    assert lumi.partitions["standard-g"].whole_node
    assert not lumi.partitions["small-g"].whole_node and not lumi.partitions["dev-g"].whole_node
    assert all(part.default_time is None for part in lumi.partitions.values())
