"""The typed run record: records written by hpclaunch 0.1.0 still load, keys of other
versions are kept, and the job's events (events.jsonl) are folded in when read."""

from __future__ import annotations

import json
from pathlib import Path

from hpclaunch.records import runrecord

RECORD_0_1_0 = {  # as hpclaunch 0.1.0 wrote it (git.dirty a string, no job events)
    "run_id": "20261101-120000-000-ab12",
    "exp": "default",
    "cluster": "slurm",
    "backend": "slurm",
    "run_dir": "/scratch/p/alice/runs/default/20261101-120000-000-ab12",
    "checkpoint_dir": "/scratch/p/alice/runs/default/20261101-120000-000-ab12/checkpoints",
    "job_id": "12345",
    "job_ids": ["12345"],
    "submitted_at": 1761998400.0,
    "state": "COMPLETED",
    "exit_code": 0,
    "command": ["python", "train.py"],
    "argv": ["hpclaunch", "run", "--", "python", "train.py"],
    "options": {"nodes": "2"},
    "cwd": "/home/alice/project",
    "code": {"cwd": "/home/alice/project"},
    "hpclaunch_version": "0.1.0",
    "nodes": 2,
    "tasks_per_node": 4,
    "launcher": "srun",
    "job_name": "train.py",
    "git": {"commit": "abc", "dirty": "true"},
    "a_key_from_the_future": {"x": 1},
}


def test_a_0_1_0_record_loads_and_keeps_what_it_holds(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps(RECORD_0_1_0))
    record = runrecord.load(tmp_path)
    assert (record.run_id, record.state, record.exit_code) == (
        RECORD_0_1_0["run_id"],
        "COMPLETED",
        0,
    )
    assert record.world_size == 8 and record.job_ids == ["12345"]
    assert record.extra == {"a_key_from_the_future": {"x": 1}}
    again = record.to_dict()
    assert {k: again[k] for k in RECORD_0_1_0} == RECORD_0_1_0  # nothing lost on the way
    runrecord.update(tmp_path, state="COMPLETED")
    assert runrecord.read_raw(tmp_path)["a_key_from_the_future"] == {"x": 1}


def test_foreign_types_fall_back_to_defaults(tmp_path: Path) -> None:
    data = {"run_id": "r", "nodes": "two", "exit_code": True, "job_ids": "x", "step": "yes"}
    (tmp_path / "run.json").write_text(json.dumps(data))
    record = runrecord.load(tmp_path)
    assert (record.nodes, record.exit_code, record.job_ids, record.step) == (None, None, [], False)


def test_events_are_folded_in(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "state": "FAILED"}))
    lines = [
        {"event": "rank_start", "rank": 0, "node": "n1", "pid": 10, "time": 100.0},
        {"event": "rank_start", "rank": 1, "node": "n2", "pid": 11, "time": 100.5},
        {"event": "stage_ready", "node": "n1", "time": 99.0},
        {"event": "rank_end", "rank": 1, "node": "n2", "returncode": -9, "time": 104.0},
        {"event": "rank_end", "rank": 0, "node": "n1", "returncode": 3, "time": 103.0},
    ]
    text = "\n".join(json.dumps(e) for e in lines) + '\n{"event": "rank_end", "rank": 2, "ti\n'
    (tmp_path / "events.jsonl").write_text(text + "\xff not json\n", errors="surrogateescape")
    events = runrecord.load(tmp_path).events
    assert events.started == {0: "n1", 1: "n2"} and events.nodes == ["n1", "n2"]
    assert events.returncodes == {0: 3, 1: -9}
    assert events.first_failure == (0, 3)  # ended first, though appended second
    assert (events.first_start, events.last_end) == (100.0, 104.0)
    assert events.staged_nodes == ("n1",)
