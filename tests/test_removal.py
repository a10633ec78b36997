"""`hpclaunch rm` and `hpclaunch gc` on the local backend (no Slurm needed): run and
sweep folders and their index lines deleted, never an active run; a list first, a
question on a terminal, --yes without one; no symbolic link followed out of the run
root (records/removal.py, cli/removal_cmds.py, records/index.drop)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from builders import local_env
from hpclaunch.records import index
from hpclaunch.records.removal import Doomed, collectable, parse_age

HPCLAUNCH = str(Path(sys.executable).parent / "hpclaunch")
DAY = 86400.0


def _cli(
    work: Path, *args: str, stdin: Any = subprocess.DEVNULL
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPCLAUNCH, *args], cwd=work, env=local_env(work), stdin=stdin, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip


def _run(work: Path, *program: str, exp: str = "default") -> Path:
    done = _cli(work, "run", "--wait", "--json", "--exp", exp, "--", *program)
    return Path(json.loads(done.stdout.splitlines()[0])["run_dir"])


def _indexed(work: Path) -> list[str]:
    return [e["run_id"] for e in index.read(local_env(work)).entries]


def _age(run_dir: Path, days: float) -> None:
    """The run as if started `days` ago: its record and its index line (the last wins)."""
    when = time.time() - days * DAY
    record = json.loads((run_dir / "run.json").read_text())
    record["submitted_at"] = when
    (run_dir / "run.json").write_text(json.dumps(record))
    env = local_env(run_dir.parents[2])
    entry = next(e for e in index.read(env).entries if e["run_id"] == run_dir.name)
    index.add({**entry, "submitted_at": when}, env)


def test_rm_deletes_the_folder_and_the_index_line_of_that_run_only(tmp_path: Path) -> None:
    old, kept = _run(tmp_path, "true"), _run(tmp_path, "true")
    refused = _cli(tmp_path, "rm", old.name)  # no terminal (stdin /dev/null), no --yes
    assert refused.returncode == 2 and "--yes" in refused.stderr, refused.stderr
    assert refused.stderr.count("\n") == 1 and old.is_dir()
    assert str(old) in refused.stdout  # what it would delete, listed first
    done = _cli(tmp_path, "rm", old.name, "--yes", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)  # one JSON object
    assert [d["run_id"] for d in shown["deleted"]] == [old.name] and shown["kept"] == []
    assert not old.exists() and kept.is_dir()
    assert _indexed(tmp_path) == [kept.name]
    assert (index.path(local_env(tmp_path)).stat().st_mode & 0o077) == 0  # still private


def test_rm_asks_on_a_terminal(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "true")
    for answer, exists in ((b"n\n", True), (b"y\n", False)):
        leader, follower = pty.openpty()
        os.write(leader, answer)
        asked = _cli(tmp_path, "rm", run_dir.name, stdin=follower)
        os.close(follower)
        os.close(leader)
        assert "delete these 1?" in asked.stderr, asked.stderr
        assert run_dir.exists() is exists, asked.stderr


def test_rm_refuses_an_active_run_in_one_line(tmp_path: Path) -> None:
    env = local_env(tmp_path)
    program = [sys.executable, "-c", "import time; time.sleep(60)"]
    running = subprocess.Popen(
        [HPCLAUNCH, "run", "--", *program], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        run_dir = _wait_for_state(tmp_path, "RUNNING")
        refused = _cli(tmp_path, "rm", "last", "--yes")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr.count("\n") == 1 and "RUNNING" in refused.stderr
        assert "cancel" in refused.stderr and run_dir.is_dir()
        gc = _cli(tmp_path, "gc", "--older-than", "0s", "--yes")
        assert gc.returncode == 0 and run_dir.is_dir(), gc.stderr  # gc keeps it too
    finally:
        _cli(tmp_path, "cancel", "last")
        running.wait(60)


def _wait_for_state(work: Path, state: str) -> Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        shown = _cli(work, "status", "last", "--json")
        if shown.returncode == 0 and json.loads(shown.stdout)["state"] == state:
            return Path(json.loads(shown.stdout)["run_dir"])
        time.sleep(0.3)
    raise AssertionError(f"no run reached {state}")


def test_rm_deletes_a_sweep_with_its_points_not_a_point_alone(tmp_path: Path) -> None:
    started = _cli(tmp_path, "sweep", "--json", "--grid", "k=1,2", "--", "true")
    assert started.returncode == 0, started.stderr
    sweep_dir = Path(json.loads(started.stdout.splitlines()[0])["sweep_dir"])
    point = _cli(tmp_path, "rm", f"{sweep_dir.name}:1", "--yes")
    assert point.returncode == 2 and f"hpclaunch rm {sweep_dir.name}" in point.stderr
    assert (sweep_dir / "points" / "1").is_dir()
    whole = _cli(tmp_path, "rm", sweep_dir.name, "--yes")
    assert whole.returncode == 0, whole.stderr
    assert not sweep_dir.exists() and _indexed(tmp_path) == []


def test_gc_deletes_old_ended_runs_by_age_state_and_experiment(tmp_path: Path) -> None:
    young, old = _run(tmp_path, "true"), _run(tmp_path, "true")
    failed = _run(tmp_path, "false")
    other_exp = _run(tmp_path, "true", exp="keep")
    for folder in (old, failed, other_exp):
        _age(folder, 40)
    _age(young, 10)
    by_state = _cli(tmp_path, "gc", "--state", "failed", "--yes")
    assert by_state.returncode == 0, by_state.stderr
    assert not failed.exists() and old.is_dir()
    by_exp = _cli(tmp_path, "gc", "--exp", "default", "--yes", "--json")
    assert [d["run_id"] for d in json.loads(by_exp.stdout)["deleted"]] == [old.name]
    assert young.is_dir() and other_exp.is_dir()
    assert sorted(_indexed(tmp_path)) == sorted([young.name, other_exp.name])
    nothing = _cli(tmp_path, "gc", "--older-than", "60d")
    assert nothing.returncode == 0 and "nothing to delete" in nothing.stderr


def test_gc_refuses_a_bad_age_in_one_line(tmp_path: Path) -> None:
    refused = _cli(tmp_path, "gc", "--older-than", "soon")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "--older-than" in refused.stderr and "30d" in refused.stderr
    assert parse_age("30d") == parse_age("30") == 30 * DAY and parse_age("12h") == 12 * 3600


def test_no_symbolic_link_is_followed_out_of_the_run_root(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "true")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    (run_dir / "logs" / "link").symlink_to(outside)  # planted inside the run folder
    # A second run whose experiment folder is replaced by a link to another place.
    planted = _run(tmp_path, "true", exp="shared")
    target = tmp_path / "victim"
    (planted.parent).rename(target)
    planted.parent.symlink_to(target)
    done = _cli(tmp_path, "rm", run_dir.name, planted.name, "--yes")
    assert done.returncode == 1, done.stderr  # one kept, said
    assert "symbolic link" in done.stderr
    assert not run_dir.exists()
    assert (outside / "precious").read_text() == "keep me"
    assert (target / planted.name / "run.json").is_file()
    assert _indexed(tmp_path) == [planted.name]  # its line stays with it


def test_collectable_takes_ended_old_runs_and_sweeps_with_a_point_in_the_state() -> None:
    now = 100 * DAY

    def item(run_id: str, state: str, days: Optional[float], sweep: bool = False) -> Doomed:
        started = None if days is None else now - days * DAY
        return Doomed(run_id, Path(run_id), sweep, state, state == "RUNNING", started)

    found = [
        item("old", "COMPLETED", 40),
        item("young", "COMPLETED", 2),
        item("running", "RUNNING", 40),
        item("unknown-age", "FAILED", None),
        item("sweep", "1 COMPLETED, 2 FAILED", 40, sweep=True),
    ]
    chosen = collectable(found, 30 * DAY, None, now)
    assert [d.run_id for d in chosen] == ["old", "sweep"]
    assert [d.run_id for d in collectable(found, 30 * DAY, "FAILED", now)] == ["sweep"]


def test_index_drop_keeps_every_other_line_and_damaged_ones(tmp_path: Path) -> None:
    env = local_env(tmp_path)
    for run_id in ("a", "b", "c"):
        index.add({"run_id": run_id, "run_dir": str(tmp_path / run_id)}, env)
    with open(index.path(env), "ab") as fh:
        fh.write(b"{damaged\n")
    assert index.drop({"b", "nosuch"}, env) == 1
    lines = index.path(env).read_bytes().splitlines()
    assert lines[-1] == b"{damaged" and len(lines) == 3
    assert [e["run_id"] for e in index.read(env).entries] == ["c", "a"]


def test_over_remote_rm_and_gc_ask_on_the_laptops_terminal(monkeypatch: Any) -> None:
    from hpclaunch.remote import forward

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert forward.wants_terminal(["rm", "RUN"]) and forward.wants_terminal(["gc"])
    assert not forward.wants_terminal(["rm", "RUN", "--yes"])
    assert not forward.wants_terminal(["gc", "--json"])  # JSON comes back through the pipe
