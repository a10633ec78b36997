"""LUMI's partial-node GPU partitions (small-g, dev-g) with tasks per node given: one
GCD per task, 7 CPUs each, CPU masks only for whole nodes or --exclusive (shared/LUMI.md,
"Node and partitions" and "Choices for the lumi profile"). Issue #28 item 3: before, 8
tasks per node shared the partition's default 1 GCD with 1 CPU each.

Golden dry-runs for 1x1, 1x4, 1x8 and 2x8 (nodes x tasks per node); the 1x1 files are
tests/test_lumi_partitions.py's. Regenerate after an intended change with:
    UPDATE_GOLDEN=1 pytest tests/test_lumi_partial_nodes.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpclaunch.errors import UserError
from test_lumi_golden import MASKS
from test_lumi_partitions import MEM_60G, _plan, _shape

GOLDEN = Path(__file__).parent / "golden"
PARTIAL = ("small-g", "dev-g")
SHAPES = ((1, 4), (1, 8), (2, 8))


def _cli(partition: str, nodes: int, tasks: int) -> dict[str, object]:
    return {"partition": partition, "nodes": str(nodes), "tasks_per_node": str(tasks)}


@pytest.mark.parametrize("partition", PARTIAL)
@pytest.mark.parametrize(("nodes", "tasks"), [(1, 1), *SHAPES])
def test_gpus_per_node_follow_the_tasks(partition: str, nodes: int, tasks: int) -> None:
    spec, plan = _plan(_cli(partition, nodes, tasks))
    assert _shape(spec) == (tasks, tasks, 7, MEM_60G, None)
    assert spec.nodes == nodes
    assert spec.cpu_bind == "" and "--cpu-bind" not in plan.script  # not a whole node
    assert f"{tasks} GPU{'s' if tasks > 1 else ''} per node, one per task" in plan.script


@pytest.mark.parametrize("partition", PARTIAL)
def test_exclusive_binds_eight_tasks_as_a_whole_node(partition: str) -> None:
    spec, _ = _plan({**_cli(partition, 2, 8), "exclusive": True})
    assert _shape(spec) == (8, 8, 7, MEM_60G, None)
    assert spec.cpu_bind == f"verbose,mask_cpu:{MASKS}"


@pytest.mark.parametrize("partition", PARTIAL)
def test_more_tasks_than_gcds_are_refused_in_one_line(partition: str) -> None:
    with pytest.raises(UserError) as info:
        _plan(_cli(partition, 1, 9))
    assert info.value.line() == (
        f"hpclaunch: error: --tasks-per-node: 9 tasks per node on {partition} (one task per "
        "GPU, and its nodes have 8). Ask for 8 or fewer, or give --gpus-per-node N to share GPUs"
    )


def test_given_gpus_may_be_shared_by_more_tasks() -> None:
    spec, _ = _plan({**_cli("small-g", 1, 16), "gpus_per_node": "2"})
    assert (spec.gpus_per_node, spec.tasks_per_node, spec.cpus_per_task) == (2, 16, 1)


CASES = {
    f"lumi_{nodes}x{tasks}_{partition}.sh": _cli(partition, nodes, tasks)
    for partition in PARTIAL
    for nodes, tasks in SHAPES
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_script_matches_golden_file(name: str) -> None:
    script = _plan(CASES[name])[1].script
    golden = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(script, encoding="utf-8")
    assert script == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_files_hold_one_gcd_and_seven_cpus_per_task(name: str) -> None:
    cli = CASES[name]
    text = (GOLDEN / name).read_text(encoding="utf-8")
    for line in (
        f"#SBATCH --nodes={cli['nodes']}",
        f"#SBATCH --ntasks-per-node={cli['tasks_per_node']}",
        f"#SBATCH --gpus-per-node={cli['tasks_per_node']}",
        "#SBATCH --cpus-per-task=7",
        "#SBATCH --mem-per-gpu=60G",
        f"#SBATCH --partition={cli['partition']}",
        "    --cpus-per-task=7 \\",
    ):
        assert line in text, line
    assert "--cpu-bind" not in text
