"""`sweep --pack` on the testbed (2 nodes x 2 fake GPUs, 2 cores each): one sbatch, one
srun step per node running the node agent (node/pack_agent.py), points refilled from the
queue as they end, each point a run of its own (its events, logs, record)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import PROGRAMS, Hpc

pytestmark = pytest.mark.testbed

PACK_POINT = str(PROGRAMS / "pack_point.py")
SWEEP_POINT = str(PROGRAMS / "sweep_point.py")


def _sweep(hpc: Hpc, *args: str, timeout: float = 300) -> dict[str, Any]:
    proc = hpc.run("sweep", "--json", "--pack", *args, timeout=timeout)
    assert proc.stdout, proc.stderr
    return dict(json.loads(proc.stdout.splitlines()[0]))


def _status(hpc: Hpc, sweep_id: str) -> dict[int, dict[str, Any]]:
    proc = hpc.run("sweep", "status", sweep_id, "--json")
    assert proc.returncode == 0, proc.stderr
    return {int(p["index"]): p for p in json.loads(proc.stdout)["points"]}


def _events(folder: Path) -> list[dict[str, Any]]:
    path = folder / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _runs(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every point's run in its slot: node, GPUs, cores, start and end (its own events)."""
    found = []
    for folder in sorted(sweep_dir.glob("points/*"), key=lambda p: int(p.name)):
        events = _events(folder)
        starts = [e for e in events if e["event"] == "point_start"]
        ends = [e for e in events if e["event"] == "point_end"]
        for start, end in zip(starts, ends):
            found.append({"point": int(folder.name), **start, "end": end["time"],
                          "exit_code": end["exit_code"]})  # fmt: skip
    return found


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    level = most = 0
    for _, step in edges:
        level += step
        most = max(most, level)
    return most


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["time"] < b["end"] and b["time"] < a["end"])


def test_twelve_one_gpu_points_on_two_nodes_of_two_gpus(hpc: Hpc) -> None:
    out = hpc.folder("out")
    configs = hpc.folder("cfg") / "points.txt"
    configs.write_text("".join(f"{1 + (i % 3)}\n" for i in range(12)))
    line = _sweep(hpc, "-N", "2", "--gpus-per-node", "2", "--configs", str(configs), "--wait",
                  "--", "python3", PACK_POINT, str(out))  # fmt: skip
    sweep_dir = Path(line["sweep_dir"])
    assert len(line["job_ids"]) == 1  # one sbatch
    states = _status(hpc, line["sweep_id"])
    assert [states[i]["state"] for i in range(12)] == ["COMPLETED"] * 12
    runs = _runs(sweep_dir)
    assert len(runs) == 12
    assert _most_at_once([(r["time"], r["end"]) for r in runs]) <= 4
    for a in runs:
        for b in runs:
            same = a["node"] == b["node"] and set(a["gpus"]) & set(b["gpus"])
            assert a is b or not (same and _overlap(a, b)), (a, b)
    slots = json.loads((sweep_dir / "sweep.json").read_text())["pack"]
    assert len(slots) == 4 and {s["node"] for s in slots} == {0, 1}
    for run in runs:
        seen = json.loads((out / f"p{run['point']}-r0-t1.json").read_text())
        assert seen["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, run["gpus"]))
        assert seen["env"]["SLURMD_NODENAME"] == run["node"]
        assert set(seen["cpus"]) <= set(run["cpus"])  # bound to the slot's cores
        assert (seen["env"]["RANK"], seen["env"]["WORLD_SIZE"]) == ("0", "1")
    # one step for the pack (its agent on each node), none per point
    assert {r["job_id"] for r in runs} == {line["job_ids"][0]}


def test_mixed_durations_leave_no_slot_idle_while_points_wait(hpc: Hpc) -> None:
    out = hpc.folder("out")
    configs = hpc.folder("cfg") / "points.txt"
    configs.write_text("".join(f"{8 if i % 4 == 0 else 1}\n" for i in range(12)))
    line = _sweep(hpc, "-N", "2", "--gpus-per-node", "2", "--configs", str(configs), "--wait",
                  "--", "python3", PACK_POINT, str(out))  # fmt: skip
    runs = _runs(Path(line["sweep_dir"]))
    last_start = max(r["time"] for r in runs)
    by_slot: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        by_slot.setdefault((run["node"], run["slot"]), []).append(run)
    for spans in by_slot.values():
        spans.sort(key=lambda r: r["time"])
        for done, following in zip(spans, spans[1:]):
            assert following["time"] - done["end"] < 1.5  # refilled at once
        if spans[-1]["end"] < last_start:  # queued points remained when it ended
            pytest.fail(f"slot {spans[-1]['node']}:{spans[-1]['slot']} idled")


def test_failing_hanging_and_cancelled_points(hpc: Hpc) -> None:
    out = hpc.folder("out")
    configs = hpc.folder("cfg") / "points.txt"
    configs.write_text("1 fail-once\n1 hang\n1 hang\n1\n1\n1\n")
    line = _sweep(hpc, "-N", "2", "--gpus-per-node", "2", "--retries", "1", "--point-time",
                  "00:00:20", "--configs", str(configs), "--", "python3", PACK_POINT,
                  str(out))  # fmt: skip
    sweep_dir = Path(line["sweep_dir"])
    deadline = time.time() + 120
    while not any(e["event"] == "point_start" for e in _events(sweep_dir / "points" / "2")):
        assert time.time() < deadline
        time.sleep(0.5)
    assert _status(hpc, line["sweep_id"])[2]["state"] == "RUNNING"
    cancel = hpc.run("cancel", f"{line['sweep_id']}:2")
    assert cancel.returncode == 0, cancel.stderr
    waited = hpc.run("sweep", "wait", line["sweep_id"], timeout=300)
    assert waited.returncode != 0
    states = _status(hpc, line["sweep_id"])
    assert states[0]["state"] == "COMPLETED"  # failed once, ran again in its slot
    assert (out / "p0-r0-t2.json").exists()
    assert states[1]["state"] == "FAILED"  # ended by --point-time
    assert [e.get("reason") for e in _events(sweep_dir / "points" / "1")
            if e["event"] == "point_end"] == ["point-time"]  # fmt: skip
    assert states[2]["state"] == "CANCELLED"
    assert [states[i]["state"] for i in (3, 4, 5)] == ["COMPLETED"] * 3


def test_optuna_sixteen_trials_on_four_slots(hpc: Hpc) -> None:
    space = hpc.folder("cfg") / "space.toml"
    space.write_text('x = {type = "float", low = 0.0, high = 4.0}\n')
    out = hpc.folder("out")
    line = _sweep(hpc, "-N", "2", "--gpus-per-node", "2", "--optuna", str(space), "--trials",
                  "16", "--metric", "loss", "--wait", "--", "python3", SWEEP_POINT, str(out),
                  "--sleep", "1", "--quadratic", timeout=600)  # fmt: skip
    states = _status(hpc, line["sweep_id"])
    assert [states[i]["state"] for i in range(16)] == ["COMPLETED"] * 16
    journal = hpc.cmd(["python3", "-c", _TRIALS, line["sweep_dir"], line["sweep_id"]])
    assert journal.returncode == 0, journal.stderr
    spans = json.loads(journal.stdout)
    assert [s[0] for s in spans] == ["COMPLETE"] * 16
    assert _most_at_once([(s[1], s[2]) for s in spans]) <= 4


_TRIALS = """
import json, sys
import optuna
from hpclaunch.sweeps import trials
from pathlib import Path
study = optuna.load_study(study_name=sys.argv[2], storage=trials.storage(Path(sys.argv[1])))
print(json.dumps([[t.state.name, t.datetime_start.timestamp(), t.datetime_complete.timestamp()]
                  for t in study.get_trials(deepcopy=False)]))
"""


def test_multi_rank_points_see_world_two(hpc: Hpc) -> None:
    out = hpc.folder("out")
    line = _sweep(hpc, "-N", "1", "--gpus-per-node", "2", "--gpus-per-point", "2",
                  "--tasks-per-point", "2", "--repeat", "2", "--wait", "--", "python3",
                  SWEEP_POINT, str(out), "--gloo")  # fmt: skip
    states = _status(hpc, line["sweep_id"])
    assert [states[i]["state"] for i in range(2)] == ["COMPLETED"] * 2
    for point in range(2):
        for rank in range(2):
            rec = json.loads((out / f"p{point}-a1-r{rank}.json").read_text())
            assert rec["env"]["WORLD_SIZE"] == "2"
            assert rec["sum"] == 3.0  # the all-reduce of 1 + 2 across the point's world


def test_requeue_runs_only_the_unfinished_points(hpc: Hpc) -> None:
    out = hpc.folder("out")
    configs = hpc.folder("cfg") / "points.txt"
    configs.write_text("40\n" * 8)  # two waves of 4; the limit signal comes at ~75 s
    data = hpc.folder("data") / "words.txt"  # staged again by each attempt's guards
    data.write_text("staged\n")
    line = _sweep(hpc, "-N", "2", "--gpus-per-node", "2", "-t", "2", "--requeue",
                  "--signal-before", "45", "--configs", str(configs), "--stage", str(data),
                  "--wait", "--", "python3", PACK_POINT, str(out), timeout=600)  # fmt: skip
    states = _status(hpc, line["sweep_id"])
    assert [states[i]["state"] for i in range(8)] == ["COMPLETED"] * 8
    starts = {
        i: [e for e in _events(Path(line["sweep_dir"]) / "points" / str(i))
            if e["event"] == "point_start"]
        for i in range(8)
    }  # fmt: skip
    finished_first = [i for i in range(8) if len(starts[i]) == 1]
    assert finished_first and len(finished_first) < 8  # the second attempt ran the rest only
    # every point, of either attempt, read the data its attempt's guards staged
    seen = [json.loads(p.read_text()) for p in out.glob("p*-r0-t*.json")]
    assert len(seen) == 8 and {s["data"] for s in seen} == {"staged\n"}
    done = [e for e in _events(Path(line["sweep_dir"])) if e["event"] == "stage_done"]
    assert len(done) >= 4 and all(e["ok"] for e in done)  # two attempts x two nodes, removed
