"""Run ids and the run index: sortable by time, unique under concurrency, found by prefix."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from hpclaunch.errors import UserError
from hpclaunch.records import index, refs, runpaths


def _env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_DATA_HOME": str(tmp_path / "data")}


def _create(root: str) -> str:
    paths = runpaths.create(runpaths.plan_paths(root, "exp", "", Path(root)))
    entry = {"run_id": paths.run_id, "run_dir": str(paths.run_dir), "job_id": "1"}
    index.add(entry, _env(Path(root)))
    return paths.run_id


def test_ids_are_unique_when_many_start_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    with multiprocessing.get_context("fork").Pool(8) as pool:
        ids = pool.map(_create, [str(tmp_path)] * 200)
    assert len(set(ids)) == 200
    assert len(list((tmp_path / "exp").iterdir())) == 200
    entries = index.read(_env(tmp_path)).entries
    assert len(entries) == 200  # one whole line per run: appends never interleaved
    assert [e["run_id"] for e in entries] == sorted(ids, reverse=True)


def test_ids_sort_by_time() -> None:
    earlier = runpaths.new_run_id(1_700_000_000.001)
    later = runpaths.new_run_id(1_700_000_000.002)
    much_later = runpaths.new_run_id(1_800_000_000.0)
    assert earlier < later < much_later


def test_find_by_prefix_job_id_and_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    made = []
    for job_id, stamp in (("101", 1_700_000_000.0), ("102", 1_700_000_100.0)):
        run_id = runpaths.new_run_id(stamp)
        (tmp_path / run_id).mkdir()
        entry = {"run_id": run_id, "run_dir": str(tmp_path / run_id), "job_id": job_id}
        index.add(entry, _env(tmp_path))
        made.append(run_id)
    assert refs.run_dir("last", _env(tmp_path)).name == made[1]
    assert refs.run_dir("101", _env(tmp_path)).name == made[0]
    assert refs.run_dir(made[0][:15], _env(tmp_path)).name == made[0]
    with pytest.raises(UserError, match="matches 2 runs"):
        refs.run_dir("2023", _env(tmp_path))
    with pytest.raises(UserError, match="no run matches"):
        refs.run_dir("nope", _env(tmp_path))
