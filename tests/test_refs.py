"""refs.py, the one reader of what names a run, a sweep or a point: every form a user
types (id, prefix, job id, array job id, array task, SWEEP:I, a folder, `last`) and the
one-line refusals when it names nothing or several things. Index and folders are made by
hand here; test_cancel_local.py drives the same through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpclaunch.errors import UserError
from hpclaunch.records import index, refs, sweeprecord

RUN_A = "20260101-000000-000-aaaa"
RUN_B = "20260101-000100-000-bbbb"
SWEEP_S = "20260101-000200-000-5555"
SWEEP_T = "20260101-000300-000-7777"


def _run(tmp: Path, run_id: str, env: dict[str, str], **entry: object) -> Path:
    folder = tmp / "runs" / run_id
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"run_id": run_id}))
    index.add({"run_id": run_id, "run_dir": str(folder), **entry}, env)
    return folder


def _sweep(
    tmp: Path, sweep_id: str, env: dict[str, str], points: int, arrays: list[dict[str, object]]
) -> Path:
    folder = tmp / "runs" / sweep_id
    for number in range(points):
        point = sweeprecord.point_dir(folder, number)
        point.mkdir(parents=True)
        (point / "run.json").write_text(json.dumps({"run_id": f"{sweep_id}:{number}"}))
    data = {"sweep_id": sweep_id, "points": [{"index": i} for i in range(points)]}
    sweeprecord.write(folder, {**data, "arrays": arrays})
    index.add({"run_id": sweep_id, "run_dir": str(folder), "sweep": True}, env)
    return folder


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_DATA_HOME": str(tmp_path / "xdg")}


@pytest.fixture
def made(tmp_path: Path, env: dict[str, str]) -> dict[str, Path]:
    """Two runs (a --chain of jobs 101, 102; job 201), then two sweeps: S of 3 points in
    array 500, T of 5 points in arrays 600 (points 0-2) and 700 (3-4): T is the newest."""
    return {
        "a": _run(tmp_path, RUN_A, env, job_id="102", job_ids=["101", "102"]),
        "b": _run(tmp_path, RUN_B, env, job_id="201"),
        "s": _sweep(tmp_path, SWEEP_S, env, 3, [{"job_id": "500", "offset": 0, "points": 3}]),
        "t": _sweep(tmp_path, SWEEP_T, env, 5, [
            {"job_id": "600", "offset": 0, "points": 3},
            {"job_id": "700", "offset": 3, "points": 2},
        ]),
    }  # fmt: skip


def test_every_form_of_a_run(made: dict[str, Path], env: dict[str, str]) -> None:
    for ref in (RUN_A, RUN_A[:-2], "101", "102"):  # id, unique prefix, a --chain's jobs
        assert refs.run_dir(ref, env) == made["a"], ref
    assert refs.run_dir("201", env) == made["b"]
    assert refs.run_dir(str(made["b"]), env) == made["b"]  # a run folder


def test_a_run_folder_relative_to_here(
    made: dict[str, Path], env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert refs.run_dir(f"runs/{RUN_A}", env) == made["a"]
    assert refs.run_dir(f"./runs/{SWEEP_S}/points/2", env) == made["s"] / "points" / "2"
    assert refs.sweep_dir(f"runs/{SWEEP_S}", env) == made["s"]
    assert refs.run_dir(f"runs/{SWEEP_S}:1", env) == made["s"] / "points" / "1"
    with pytest.raises(UserError, match="no run matches 'runs'"):
        refs.run_dir("runs", env)  # no `/`: an id
    with pytest.raises(UserError, match="is no run or sweep folder"):
        refs.run_dir("./runs", env)
    with pytest.raises(UserError, match="is a sweep, not a run"):
        refs.run_dir(f"runs/{SWEEP_S}", env)
    with pytest.raises(UserError, match="is a run, not a sweep"):
        refs.sweep_dir(f"runs/{RUN_A}", env)


def test_every_form_of_a_point(made: dict[str, Path], env: dict[str, str]) -> None:
    s, t = made["s"], made["t"]
    for ref in (f"{SWEEP_S}:2", f"{SWEEP_S[:-2]}:2", "500:2", "500_2", f"{s}:2"):
        assert refs.run_dir(ref, env) == s / "points" / "2", ref
    assert refs.run_dir("last:1", env) == t / "points" / "1"  # the newest sweep's point
    assert refs.run_dir("700_1", env) == t / "points" / "4"  # array task: its offset + task
    assert refs.run_dir("700:4", env) == t / "points" / "4"  # SWEEP:I by any array of it
    with pytest.raises(UserError, match=r"'500:3' names no point of sweep .*points 0-2"):
        refs.run_dir("500:3", env)
    with pytest.raises(UserError, match="no run matches '700_2'"):
        refs.run_dir("700_2", env)  # array 700 has tasks 0-1 only


def test_every_form_of_a_sweep(made: dict[str, Path], env: dict[str, str]) -> None:
    for ref in (SWEEP_S, SWEEP_S[:-3], "500", str(made["s"])):
        assert refs.sweep_dir(ref, env) == made["s"], ref
    assert refs.sweep_dir("700", env) == refs.sweep_dir("last", env) == made["t"]


def test_last_is_the_newest_run_or_sweep(made: dict[str, Path], env: dict[str, str]) -> None:
    t = made["t"]
    assert refs.run_or_sweep("last", env) == refs.Found(t, True)
    assert refs.run_dir("last", env) == t / "points" / "0"  # no point started yet
    (t / "points" / "3" / "events.jsonl").write_text("{}\n")
    (t / "points" / "1" / "events.jsonl").write_text("{}\n")
    assert refs.run_dir("last", env) == t / "points" / "3"  # the most recently started
    _run(made["a"].parent.parent, "20260101-000400-000-cccc", env, job_id="301")
    assert refs.run_dir("last", env).name == "20260101-000400-000-cccc"  # a newer run


def test_run_or_sweep_takes_a_run_first(made: dict[str, Path], env: dict[str, str]) -> None:
    assert refs.run_or_sweep(SWEEP_S, env) == refs.Found(made["s"], True)
    assert refs.run_or_sweep("500", env) == refs.Found(made["s"], True)  # its array job
    assert refs.run_or_sweep(SWEEP_S[:-2], env) == refs.Found(made["s"], True)
    assert refs.run_or_sweep("201", env) == refs.Found(made["b"], False)
    assert refs.run_or_sweep(f"{SWEEP_T}:0", env) == refs.Found(made["t"] / "points" / "0", False)
    assert refs.sweep_of(made["t"] / "points" / "4") == (made["t"], 4)
    assert refs.sweep_of(made["a"]) is None


def test_names_that_match_several_or_nothing(made: dict[str, Path], env: dict[str, str]) -> None:
    cases = {
        "20260101-0001": None,  # one run (B) and no sweep: B
        "20260101-000": "'20260101-000' matches 2 runs",
        "nope": "no run matches 'nope'",
        SWEEP_S: f"'{SWEEP_S}' is a sweep, not a run",
    }
    for ref, message in cases.items():
        if message is None:
            assert refs.run_dir(ref, env) == made["b"]
            continue
        with pytest.raises(UserError) as caught:
            refs.run_dir(ref, env)
        assert message in caught.value.render(), ref
    with pytest.raises(UserError, match=r"'20260101-000' matches 2 sweeps.*Type more of it"):
        refs.sweep_dir("20260101-000", env)
    with pytest.raises(UserError, match="no sweep matches 'nope'"):
        refs.sweep_dir("nope", env)
    with pytest.raises(UserError, match=r"'20260101-000' matches 2 sweeps"):
        refs.run_or_sweep("20260101-000:0", env)
    index.add({"run_id": "x", "run_dir": str(made["b"]), "job_id": "201"}, env)
    with pytest.raises(UserError, match=r"job id '201' belongs to 2 runs"):
        refs.run_dir("201", env)


def test_nothing_recorded_yet(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(UserError, match=r"RUN: no runs recorded yet \('last'\)"):
        refs.run_dir("last", env)
    with pytest.raises(UserError, match=r"SWEEP: no sweeps recorded yet \('last'\)"):
        refs.sweep_dir("last", env)
    _sweep(tmp_path, SWEEP_S, env, 1, [])
    with pytest.raises(UserError, match="is a sweep, not a run"):
        refs.run_dir(SWEEP_S[:8], env)
    assert refs.run_dir("last", env) == tmp_path / "runs" / SWEEP_S / "points" / "0"


def test_the_api_finds_what_the_cli_finds(made: dict[str, Path], env: dict[str, str]) -> None:
    from hpclaunch import api

    assert api.get(str(made["a"]), environ=env).run_dir == made["a"]
    assert api.get("500_1", environ=env).run_dir == made["s"] / "points" / "1"
    assert api.get("last", environ=env).run_dir == made["t"] / "points" / "0"
