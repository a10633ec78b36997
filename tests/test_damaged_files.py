"""No traceback from a damaged or foreign file: hpclaunch.toml, the runs index, run.json.
Writes to the index and to records are atomic and concurrent writers lose nothing."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

from builders import bare_local_env
from conftest import VENV_BIN
from hpclaunch.records import index, runpaths, runrecord

HPCLAUNCH = str(VENV_BIN / "hpclaunch")


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPCLAUNCH, *args], cwd=tmp_path, env=bare_local_env(tmp_path), capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip


def _one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpclaunch: error:"), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"[run]\nnodes = 2\n# caf\xe9\n", ("hpclaunch.toml", "not UTF-8")),
        (b"[run\nnodes = 2\n", ("hpclaunch.toml", "not valid TOML")),
        (b"\xff\xfe[\x00r\x00", ("hpclaunch.toml", "not UTF-8")),
        (b'[run]\nnodes = "many"\n', ("nodes", "not a whole number")),
        (b"[jobs]\n", ("unknown table",)),
    ],
)
def test_damaged_project_file_is_one_line(
    tmp_path: Path, content: bytes, words: tuple[str, ...]
) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "hpclaunch.toml").write_bytes(content)
    _one_line_error(_cli(tmp_path, "run", "--dry-run", "--", "true"), *words)


def test_unreadable_project_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "hpclaunch.toml").mkdir()  # a folder where a file should be
    _one_line_error(_cli(tmp_path, "run", "--dry-run", "--", "true"), "hpclaunch.toml")


def test_broken_index_lines_are_skipped_with_a_warning(tmp_path: Path) -> None:
    ok = _cli(tmp_path, "run", "--", "true")
    assert ok.returncode == 0, ok.stderr
    path = tmp_path / "xdg" / "hpclaunch" / "runs.jsonl"
    with open(path, "ab") as fh:
        fh.write(b'{"run_id": "cut sh\n')  # cut short
        fh.write(b"\xff\xfe not utf-8\n")
        fh.write(b'{"run_id": "20990101-000000-000-ffff"}\n')  # a line missing fields
        fh.write(b'["another", "version"]\n')
        fh.write(b'{"run_id": 7, "run_dir": 8}\n')
    listing = _cli(tmp_path, "runs", "--json")
    assert listing.returncode == 0, listing.stderr
    assert "Traceback" not in listing.stderr
    assert len([json.loads(line) for line in listing.stdout.splitlines()]) == 1
    warnings = [line for line in listing.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 4 and "runs.jsonl:2: not a run entry" in warnings[0], warnings
    status = _cli(tmp_path, "status", "last")
    assert status.returncode == 0 and "COMPLETED" in status.stdout


@pytest.mark.parametrize("content", [b"[1, 2]", b'"text"', b"{not json", b"\xff\xfe"])
def test_run_json_that_is_not_a_record(tmp_path: Path, content: bytes) -> None:
    ok = _cli(tmp_path, "run", "--", "true")
    assert ok.returncode == 0, ok.stderr
    record = next((tmp_path / "runs" / "default").iterdir()) / "run.json"
    record.write_bytes(content)
    for args in (("status", "last"), ("show", "last"), ("logs", "last"), ("cancel", "last")):
        _one_line_error(_cli(tmp_path, *args), "run.json")
    listing = _cli(tmp_path, "runs")
    assert listing.returncode == 0 and "run.json" in listing.stderr
    assert "Traceback" not in listing.stderr


def _update_many(run_dir: str, worker: int) -> None:
    for n in range(50):
        runrecord.update(Path(run_dir), **{f"w{worker}_{n}": n})


def test_concurrent_record_writers_lose_nothing(tmp_path: Path) -> None:
    paths = runpaths.create(runpaths.plan_paths(str(tmp_path), "exp", "", tmp_path))
    runrecord.create(paths.run_dir, {"run_id": paths.run_id})
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_update_many, args=(str(paths.run_dir), w)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    data = runrecord.read_raw(paths.run_dir)
    assert all(data[f"w{w}_{n}"] == n for w in range(4) for n in range(50))
    assert not [p for p in paths.run_dir.iterdir() if p.name.endswith(".tmp")]


def test_index_appends_from_many_processes_stay_whole(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path)}
    code = (
        "import sys; from hpclaunch.records import index\n"
        "for n in range(100):\n"
        "    index.add({'run_id': f'{sys.argv[1]}-{n:03d}', 'run_dir': 'x' * 3000}, "
        f"{env!r})\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, f"p{p}"], cwd=tmp_path) for p in range(4)
    ]
    assert all(p.wait(120) == 0 for p in procs)
    listing = index.read(env)
    assert len(listing.entries) == 400 and listing.skipped == []


@pytest.mark.parametrize("option", ["--run-root", "--exp", "--job-name", "--venv", "--container"])
def test_a_line_break_names_the_option_given(tmp_path: Path, option: str) -> None:
    proc = _cli(tmp_path, "run", option, "a\nb", "--dry-run", "--", "true")
    _one_line_error(proc, f"{option}:")
