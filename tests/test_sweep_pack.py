"""`sweep --pack`'s slot plan (hpclaunch.sweeps.packing): slots per node, their GPUs and
cores, and the bad requests refused with one line before anything is queued."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpclaunch.backends import packstatus
from hpclaunch.errors import UserError
from hpclaunch.observe.jobend import JobStatus
from hpclaunch.records.runrecord import RunRecord
from hpclaunch.sweeps.packing import NodeFacts, PackOptions, check, slots, table

TWO_GPUS = NodeFacts(gpus=2, cpus=8)
LUMI_G = NodeFacts(
    gpus=8,
    cpus=64,
    # the GCDs' CCDs, low-noise mode (shared/LUMI.md): GCD g -> cores of its CCD minus core 0
    gpu_cores=tuple(tuple(range(8 * ccd + 1, 8 * ccd + 8)) for ccd in (6, 7, 2, 3, 0, 1, 4, 5)),
)


def test_one_gpu_slots_on_two_nodes_of_two_gpus() -> None:
    planned = slots(PackOptions(), TWO_GPUS, nodes=2)
    assert [(s.node, s.number, s.gpus, s.cpus) for s in planned] == [
        (0, 0, (0,), (0, 1, 2, 3)),
        (0, 1, (1,), (4, 5, 6, 7)),
        (1, 0, (0,), (0, 1, 2, 3)),
        (1, 1, (1,), (4, 5, 6, 7)),
    ]


def test_two_gpu_slots_take_the_cores_of_their_gcds() -> None:
    planned = slots(PackOptions(gpus_per_point=2), LUMI_G, nodes=1)
    assert len(planned) == 4
    assert planned[0].gpus == (0, 1)
    assert planned[0].cpus == (*range(49, 56), *range(57, 64))  # GCD 0 and 1's CCDs


def test_cpu_slots_without_gpus() -> None:
    planned = slots(PackOptions(cpus_per_point=3), NodeFacts(gpus=0, cpus=8), nodes=1)
    assert [s.cpus for s in planned] == [(0, 1, 2), (3, 4, 5)]
    assert all(s.gpus == () for s in planned)
    # default: the cores a point's tasks ask
    by_tasks = slots(PackOptions(tasks_per_point=2), NodeFacts(gpus=0, cpus=8), 1, 2)
    assert [s.cpus for s in by_tasks] == [(0, 1, 2, 3), (4, 5, 6, 7)]


@pytest.mark.parametrize(
    ("opts", "field", "words"),
    [
        (PackOptions(gpus_per_point=3), "--gpus-per-point", "does not divide a node's 4 GPUs"),
        (PackOptions(gpus_per_point=8), "--gpus-per-point", "more than a node's 4 GPUs"),
        (PackOptions(cpus_per_point=9), "--cpus-per-point", "above a node"),
        (PackOptions(pack_jobs=0), "--pack-jobs", "below 1"),
        (PackOptions(pack_jobs=13), "--pack-jobs", "above the points"),
        (PackOptions(tasks_per_point=2), "--tasks-per-point", "more than a slot's 1 GPUs"),
        (PackOptions(retries=-1), "--retries", "below 0"),
    ],
)
def test_bad_pack_requests_are_one_line(opts: PackOptions, field: str, words: str) -> None:
    with pytest.raises(UserError) as caught:
        check(opts, NodeFacts(gpus=4, cpus=8), points=12)
    text = caught.value.render()
    assert text.startswith(f"{field}: ") and words in text
    assert "\n" not in text


def test_good_requests_pass_and_the_table_names_every_slot() -> None:
    check(PackOptions(gpus_per_point=2, tasks_per_point=2, pack_jobs=12), TWO_GPUS, points=12)
    rows = table(slots(PackOptions(), TWO_GPUS, nodes=2))
    assert rows[1:] == [
        "#   node 0  slot 0  gpus 0  cores 0-3",
        "#   node 0  slot 1  gpus 1  cores 4-7",
        "#   node 1  slot 0  gpus 0  cores 0-3",
        "#   node 1  slot 1  gpus 1  cores 4-7",
    ]


# --- a packed point's state: its own events and the allocation's (backends/packstatus) ---
def _point(tmp_path: Path, *events: dict[str, Any]) -> RunRecord:
    folder = tmp_path / "points" / "3"
    folder.mkdir(parents=True)
    lines = "".join(json.dumps({"job": "77", "time": 1.0, **e}) + "\n" for e in events)
    (folder / "events.jsonl").write_text(lines)
    return RunRecord("s:3", str(folder), job_id="77", state="PENDING",
                     extra={"packed": True, "point": 3})  # fmt: skip


RUNNING_JOB = JobStatus("RUNNING", "", None)
START = {"event": "point_start", "node": "node2", "slot": 1, "gpus": [1], "task": "77_0"}


def test_a_packed_point_runs_where_its_start_says(tmp_path: Path) -> None:
    rec = _point(tmp_path, START)
    assert packstatus.allocation(rec) == "77_0"
    assert packstatus.changes(rec, RUNNING_JOB) == {
        "state": "RUNNING",
        "reason": "node node2 slot 1 gpus 1",
    }


def test_a_queued_packed_point_is_pending_and_never_started_once_the_pack_ended(
    tmp_path: Path,
) -> None:
    rec = _point(tmp_path)
    assert packstatus.changes(rec, RUNNING_JOB)["state"] == "PENDING"
    gone = packstatus.changes(rec, JobStatus("COMPLETED", "", "0:0"))
    assert (gone["state"], gone["reason"]) == ("CANCELLED", packstatus.NEVER_STARTED)


def test_a_started_packed_point_without_an_end_is_failed_node_lost(tmp_path: Path) -> None:
    rec = _point(tmp_path, START)
    lost = packstatus.changes(rec, JobStatus("COMPLETED", "", "0:0"))
    assert (lost["state"], lost["reason"], lost["exit_code"]) == ("FAILED", "node lost", 1)


def test_a_packed_points_end_is_the_agents_word(tmp_path: Path) -> None:
    end = {"event": "point_end", "exit_code": 143, "reason": "point-time"}
    rec = _point(tmp_path, START, end)
    got = packstatus.changes(rec, None)
    assert (got["state"], got["exit_code"], got["reason"]) == ("FAILED", 143, "point-time")
    cancelled = packstatus.ended({"exit_code": 143, "reason": "cancelled"})
    assert cancelled["state"] == "CANCELLED"


# --- LUMI's standard-g (a fake is unavoidable: the testbed has no LUMI; shared/LUMI.md) ---
def test_a_lumi_pack_binds_each_gcd_slot_to_its_ccd(tmp_path: Path) -> None:
    from hpclaunch.planning import preparing
    from hpclaunch.records.runpaths import RunPaths
    from hpclaunch.sweeps import packplan
    from hpclaunch.sweeps.packing import PackOptions
    from hpclaunch.sweeps.points import Point

    cli = {"cluster": "lumi", "nodes": "2", "partition": "standard-g",
           "account": "project_465000000", "time": "1:00:00"}  # fmt: skip
    environ = {"USER": "alice", "HOME": "/users/alice", "PATH": "/usr/bin:/bin"}
    resolved = preparing.prepare_spec(cli, ("python", "train.py"), tmp_path, environ)
    sweep = RunPaths("S", tmp_path / "S", tmp_path / "S" / "checkpoints")
    points = [Point(i, {"lr": i}) for i in range(20)]
    pp = packplan.plan(resolved.spec, resolved.profile, PackOptions(), sweep, tmp_path, points,
                       "TOKEN", None)  # fmt: skip
    # GCD 0..7 -> cores 49-55, 57-63, 17-23, 25-31, 1-7, 9-15, 33-39, 41-47 (LUMI.md)
    firsts = [49, 57, 17, 25, 1, 9, 33, 41]
    assert [(s.gpus, s.cpus) for s in pp.slots[:8]] == [
        ((g,), tuple(range(first, first + 7))) for g, first in enumerate(firsts)
    ]
    assert len(pp.slots) == 16
    assert pp.instructions["gpu_vars"] == ["ROCR_VISIBLE_DEVICES"]
    assert pp.instructions["gpu_unset"] == ["HIP_VISIBLE_DEVICES"]
    facts = packplan.node_facts(resolved.spec, resolved.profile, 0)
    script = packplan.batch_script(resolved.spec, sweep, tmp_path, pp, facts.cpus)
    assert "#SBATCH --cpus-per-task=56\n" in script  # never the 64 a job cannot get
    assert "#SBATCH --partition=standard-g\n" in script and "#SBATCH --no-kill\n" in script
    assert "--cpus-per-task=56 python3 -I -S " in script
