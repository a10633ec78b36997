"""`hpclaunch sweep --cluster local`: the same points, variables and records as on Slurm,
--max-parallel points at a time; and the pure parts of the sweep commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from builders import local_env
from hpclaunch.backends import sweepstate
from hpclaunch.errors import UserError
from hpclaunch.sweeps import ops
from sweeptools import most_at_once

PROGRAMS = Path(__file__).parent / "programs"
POINT = str(PROGRAMS / "sweep_point.py")
HPCLAUNCH = str(Path(sys.executable).parent / "hpclaunch")


def _hpclaunch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPCLAUNCH, *args], cwd=tmp_path, env=local_env(tmp_path), capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip


def _spans(sweep_dir: Path) -> list[tuple[float, float]]:
    spans = []
    for events in sweep_dir.glob("points/*/events.jsonl"):
        times = [json.loads(line) for line in events.read_text().splitlines()]
        starts = [e["time"] for e in times if e["event"] == "rank_start"]
        ends = [e["time"] for e in times if e["event"] == "rank_end"]
        spans.append((min(starts), max(ends)))
    return spans


def test_a_local_sweep_runs_every_point_two_at_a_time(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = _hpclaunch(tmp_path, "sweep", "--grid", "lr=0.1,0.2", "--repeat", "2",
                      "--max-parallel", "2", "--tasks-per-node", "2", "--",
                      sys.executable, POINT, str(out), "--sleep", "0.5",
                      "--fail-point", "3:4", "--lr={lr}", "{{lr}}")  # fmt: skip
    assert proc.returncode == 4, proc.stderr  # the lowest failed point's code
    sweep_id = proc.stdout.split()[1]
    sweep_dir = tmp_path / "runs" / "default" / sweep_id
    records = {p.stem: json.loads(p.read_text()) for p in out.glob("p*.json")}
    assert len(records) == 8  # 4 points x 2 ranks
    for point in range(4):
        for rank in (0, 1):
            rec = records[f"p{point}-a1-r{rank}"]
            params = json.loads(rec["env"]["HPCLAUNCH_PARAMS"])
            args = [bytes.fromhex(a).decode() for a in rec["argv"]]
            assert args == [f"--lr={params['lr']}", "{lr}"]  # {{lr}} is a literal {lr}
            assert rec["env"]["HPCLAUNCH_POINT"] == str(point)
            assert rec["env"]["HPCLAUNCH_SWEEP_ID"] == sweep_id
            assert rec["env"]["WORLD_SIZE"] == "2"
    assert most_at_once(_spans(sweep_dir)) == 2
    status = _hpclaunch(tmp_path, "sweep", "status", "last", "--json", "--metric", "end")
    data: dict[str, Any] = json.loads(status.stdout)
    assert [p["state"] for p in data["points"]] == ["COMPLETED"] * 3 + ["FAILED"]
    assert [p["exit_code"] for p in data["points"]] == [0, 0, 0, 4]
    ends = {p["index"]: p["result"]["end"] for p in data["points"] if p["state"] == "COMPLETED"}
    assert data["best"]["index"] == min(ends, key=lambda i: (ends[i], i))  # earliest end
    shown = _hpclaunch(tmp_path, "logs", f"{sweep_id}:1", "--rank", "0")
    assert shown.returncode == 0, shown.stderr
    listed = _hpclaunch(tmp_path, "runs")
    assert sweep_id in listed.stdout and "3 COMPLETED 1 FAILED" in listed.stdout


def test_a_local_optuna_sweep_tells_every_trial(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "space.yaml").write_text("x: {type: float, low: -3, high: 3}\n")
    proc = _hpclaunch(tmp_path, "sweep", "--optuna", "space.yaml", "--trials", "4",
                      "--metric", "loss", "--max-parallel", "2", "--",
                      sys.executable, POINT, str(out), "--quadratic", "--x", "{x}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sweep_id = proc.stdout.split()[1]
    journal = tmp_path / "runs" / "default" / sweep_id / "optuna.journal"
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal))
    )
    study = optuna.load_study(study_name=sweep_id, storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    status = json.loads(_hpclaunch(tmp_path, "sweep", "status", sweep_id, "--json").stdout)
    assert status["best"]["result"]["loss"] == pytest.approx(study.best_value)


def test_points_text() -> None:
    assert ops.parse_points("3,7,10-12", 20) == [3, 7, 10, 11, 12]
    for bad in ("x", "5-2", "25", "-1", ","):
        with pytest.raises(UserError):
            ops.parse_points(bad, 20)


def test_best_point_ignores_missing_and_non_finite_metrics() -> None:
    rows = [
        {"index": 6, "result": {"loss": 0.1}, "state": "FAILED"},
        {"index": 0, "result": {"loss": float("nan")}},
        {"index": 1, "result": {"loss": 0.5}},
        {"index": 2, "result": None},
        {"index": 3, "result": {"loss": 0.5}},
        {"index": 4, "result": {"loss": True}},
        {"index": 5, "result": {"loss": 0.7}},
    ]
    best = sweepstate.best(rows, "loss", "minimize")
    assert best is not None and best["index"] == 1
    best = sweepstate.best(rows, "loss", "maximize")
    assert best is not None and best["index"] == 5
    assert sweepstate.best(rows, "acc", "minimize") is None


def test_a_missing_argument_names_itself_and_the_command(tmp_path: Path) -> None:
    for argv, line in (
        (
            ["sweep", "status"],
            "hpclaunch: error: SWEEP: missing. See hpclaunch sweep status --help",
        ),
        # (status without RUN means last since issue 29: cancel still needs one)
        (["cancel"], "hpclaunch: error: RUN: missing. See hpclaunch cancel --help"),
    ):
        proc = _hpclaunch(tmp_path, *argv)
        assert proc.returncode == 2 and proc.stderr.strip() == line, proc.stderr
