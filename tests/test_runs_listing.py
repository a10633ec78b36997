"""`hpclaunch runs` lists an ended sweep from the tally its sweep.json keeps: its
points' records are read once, when it is first seen ended, not by every listing
(issue 26, Performance: 10 sweeps of 1,000 points are 10,000 records)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hpclaunch.records import sweeprecord

HPCLAUNCH = str(Path(sys.executable).parent / "hpclaunch")


def _hpclaunch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPCLAUNCH"))}
    env.update(XDG_DATA_HOME=str(tmp_path / "xdg"), HPCLAUNCH_CLUSTER="local")
    return subprocess.run(
        [HPCLAUNCH, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip


def _listed(tmp_path: Path) -> list[dict[str, Any]]:
    proc = _hpclaunch(tmp_path, "runs", "--json")
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _ended_sweep(tmp_path: Path) -> Path:
    """A local sweep of 3 points, point 2 failing with exit code 3, run to its end."""
    prog = "import sys; sys.exit(3 if sys.argv[1] == '2' else 0)"
    proc = _hpclaunch(
        tmp_path, "sweep", "--grid", "x=0,1,2", "--", sys.executable, "-c", prog, "{x}"
    )
    assert proc.returncode == 3, proc.stderr
    return next((tmp_path / "runs" / "default").iterdir())


def _point_records(sweep_dir: Path) -> list[Path]:
    return sorted(sweep_dir.glob(f"{sweeprecord.POINTS}/*/run.json"))


def test_runs_does_not_read_an_ended_sweeps_point_records_again(tmp_path: Path) -> None:
    sweep_dir = _ended_sweep(tmp_path)
    first = _listed(tmp_path)  # sees the sweep ended: reads its points, keeps the tally
    assert [r["state"] for r in first] == ["2 COMPLETED 1 FAILED"]
    assert first[0]["exit_code"] == 3 and first[0]["points"] == 3
    for path in _point_records(sweep_dir):  # a listing that opened them would say so
        path.write_text("not a record")
    assert _listed(tmp_path) == first  # the same line, every field


def test_a_sweep_given_new_arrays_is_counted_from_its_points_again(tmp_path: Path) -> None:
    sweep_dir = _ended_sweep(tmp_path)
    assert [r["state"] for r in _listed(tmp_path)] == ["2 COMPLETED 1 FAILED"]
    # What `sweep retry` does: the points' records change, an array is added.
    for path in _point_records(sweep_dir):
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "state": "COMPLETED", "exit_code": 0}))
    sweeprecord.update(sweep_dir, arrays=[{"job_id": "77", "offset": 0, "points": 1}])
    again = _listed(tmp_path)
    assert [r["state"] for r in again] == ["3 COMPLETED"]
    assert again[0]["exit_code"] == 0 and again[0]["job_id"] == "77"


def test_a_local_sweep_retried_here_is_counted_from_its_points_again(tmp_path: Path) -> None:
    """A local retry runs the points again here and adds no array: the tally kept while
    the sweep had ended must not hide the new end (sweeps/ops.retry clears it)."""
    flag = tmp_path / "failed-once"
    prog = (
        "import pathlib, sys; flag = pathlib.Path(sys.argv[2])\n"
        "if sys.argv[1] == '2' and not flag.exists(): flag.touch(); sys.exit(3)"
    )
    proc = _hpclaunch(
        tmp_path, "sweep", "--grid", "x=0,1,2", "--", sys.executable, "-c", prog, "{x}", str(flag)
    )
    assert proc.returncode == 3, proc.stderr
    sweep_dir = next((tmp_path / "runs" / "default").iterdir())
    assert [r["state"] for r in _listed(tmp_path)] == ["2 COMPLETED 1 FAILED"]
    assert sweeprecord.ENDED_TALLY in sweeprecord.load(sweep_dir)
    retried = _hpclaunch(tmp_path, "sweep", "retry", "last")
    assert retried.returncode == 0, retried.stdout + retried.stderr  # point 2 passes now
    again = _listed(tmp_path)
    assert [r["state"] for r in again] == ["3 COMPLETED"]  # not the tally of the first end
    assert again[0]["exit_code"] == 0


def _as_slurm(run_json: Path, job_id: str) -> None:
    """A record rewritten as a Slurm job nobody has looked at since it started."""
    data = json.loads(run_json.read_text())
    data.update(backend="slurm", job_id=job_id, job_ids=[job_id], state="PENDING")
    data.update(exit_code=None, step=False)
    run_json.write_text(json.dumps(data))


def test_runs_asks_slurm_once_for_runs_and_sweep_points_together(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Plain runs and an open sweep's points: one squeue for all of them (issue 26: one
    squeue + at most one sacct serve runs and points alike), not one per kind."""
    from click.testing import CliRunner

    from hpclaunch.cli.records_cmds import runs_cmd
    from hpclaunch.slurm import commands

    sweep_dir = _ended_sweep(tmp_path)
    for i, path in enumerate(_point_records(sweep_dir)):
        _as_slurm(path, f"200_{i}")
    sweeprecord.update(sweep_dir, backend="slurm", arrays=[{"job_id": "200", "offset": 0}])
    run = _hpclaunch(tmp_path, "run", "--", sys.executable, "-c", "pass")
    assert run.returncode == 0, run.stderr
    run_dir = next(p for p in (tmp_path / "runs" / "default").iterdir() if p != sweep_dir)
    _as_slurm(run_dir / "run.json", "100")
    calls: list[list[str]] = []

    def answer(argv: list[str], *args: Any, **kwargs: Any) -> str:
        calls.append(list(argv))
        if argv[0] == "squeue":
            return "100|N/A|100|RUNNING|None\n" + "".join(
                f"200|{i}|{201 + i}|RUNNING|None\n" for i in range(3)
            )
        return ""

    monkeypatch.setattr(commands, "run", answer)
    monkeypatch.setattr(commands, "query", answer)
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg"), "PATH": os.environ["PATH"]}
    done = CliRunner().invoke(runs_cmd, ["--json"], env=env, catch_exceptions=False)
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for line in done.output.splitlines()]
    assert sorted(r["state"] for r in rows) == ["3 RUNNING", "RUNNING"]
    assert [c[0] for c in calls] == ["squeue"], calls  # one call serves both kinds
