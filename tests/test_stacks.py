"""`hpclaunch stack` without the testbed: grouping and normalising py-spy's threads, the
ranks found in events.jsonl, the job to attach to, the code that runs on each node (on a
fake bootstrap's process tree here) and the command on a local run."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpclaunch.cli.main import cli
from hpclaunch.observe import attach, stacks
from hpclaunch.records import runrecord

PROGRAMS = Path(__file__).parent / "programs"
PYSPY = Path(sys.executable).with_name("py-spy")
needs_pyspy = pytest.mark.skipif(not PYSPY.exists(), reason="py-spy is not installed here")


def _thread(tid: int, *frames: tuple[str, int], name: str | None = None) -> dict[str, Any]:
    return {
        "pid": 1,
        "thread_id": tid * 7919,  # py-spy's own ids differ between processes
        "os_thread_id": tid,
        "thread_name": name,
        "active": tid % 2 == 0,
        "owns_gil": False,
        "frames": [
            {"name": f, "filename": "/code/train.py", "short_filename": "train.py", "line": ln}
            for f, ln in frames
        ],
    }


def _rank(rank: int, node: str, pid: int, top: str, line: int = 10) -> dict[str, Any]:
    threads = [
        _thread(pid + 5, ("_loop", 3), name="Thread-1 (_loop)"),
        _thread(pid, (top, line), ("main", 40), ("<module>", 50)),
    ]
    return {"rank": rank, "node": node, "pid": pid, "threads": threads}


def test_equal_stacks_group_once_with_their_rank_list() -> None:
    items = [
        _rank(0, "n1", 100, "next_batch"),
        _rank(1, "n1", 200, "stuck_here"),
        _rank(2, "n2", 300, "next_batch"),
        _rank(3, "n2", 400, "next_batch"),
        {"rank": 4, "node": "n3", "error": stacks.MISSING, "missing": True},
        {"rank": 5, "node": "n3", "error": stacks.MISSING, "missing": True},
        _rank(6, "n4", 500, "next_batch", line=11),  # another line: another stack
    ]
    groups = stacks.group(items)
    assert [g.ranks for g in groups] == [[0, 2, 3], [1], [6], [4, 5]]
    assert groups[0].nodes == ["n1", "n2"] and groups[0].pids == {0: 100, 2: 300, 3: 400}
    # The main thread (its id is the pid) comes first, whatever py-spy's order.
    assert [t.name for t in groups[0].threads] == ["main", "Thread-1 (_loop)"]
    assert groups[3].error == stacks.MISSING and stacks.missing_on(items) == ["n3"]

    text = "\n".join(stacks.render(groups))
    assert text.count("stuck_here") == 1 and text.count("next_batch (train.py:10)") == 1
    assert "ranks 0,2-3 (n1, n2):\n  thread main:\n    next_batch (train.py:10)" in text
    assert "rank 1 (n1):" in text and f"ranks 4-5 (n3): {stacks.MISSING}" in text

    data = json.loads(json.dumps([g.to_dict() for g in groups]))
    assert data[1]["threads"][0]["frames"][0] == {
        "function": "stuck_here",
        "file": "/code/train.py",
        "line": 10,
    }
    assert data[3] == {"ranks": [4, 5], "nodes": ["n3"], "error": stacks.MISSING}


def test_a_rank_without_python_threads_is_an_error_not_a_stack() -> None:
    groups = stacks.group([{"rank": 0, "node": "n", "pid": 1, "threads": []}])
    assert groups[0].error == "py-spy found no Python thread"


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([0], "0"), ([3, 0, 1, 2], "0-3"), ([0, 2, 3, 5, 7, 8, 9], "0,2-3,5,7-9"), ([], "")],
)
def test_rank_list(ranks: list[int], text: str) -> None:
    assert stacks.rank_list(ranks) == text


def _run_dir(tmp_path: Path, events: list[dict[str, Any]], **record: Any) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r1", **record}))
    lines = [json.dumps(e) for e in events] + ['{"event": "rank_st']  # a cut-short line
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def test_running_ranks_come_from_the_last_attempts_events(tmp_path: Path) -> None:
    def start(rank: int, pid: int, attempt: int) -> dict[str, Any]:
        node = f"n{rank // 2}"
        return {"event": "rank_start", "rank": rank, "node": node, "pid": pid, "attempt": attempt}

    events = [
        {"event": "attempt_start", "attempt": 0, "job_id": "70", "nodes": "n[0-1]"},
        start(0, 10, 0),
        start(1, 11, 0),
        {"event": "attempt_start", "attempt": 1, "job_id": "71", "nodes": "n[0-1]"},
        start(0, 20, 1),
        start(1, 21, 1),
        start(2, 22, 1),
        {"event": "rank_end", "rank": 2, "node": "n1", "returncode": 3, "attempt": 1},
        {"event": "rank_end", "rank": 1, "node": "n0", "returncode": 0, "attempt": 1},
        start(1, 31, 1),  # started again (a torchrun restart): running again
        start(3, True, 1),  # not a pid
    ]
    record = runrecord.load(_run_dir(tmp_path, events, state="RUNNING", job_id="70"))
    running, ended = stacks.rank_tasks(record)
    assert running == {
        0: stacks.Target(0, "n0", 20),
        1: stacks.Target(1, "n0", 31),
    }
    assert ended == {2: 3}
    assert attach.job_to_join(record) == "71"  # the current attempt's job


def test_a_sweep_point_is_attached_by_its_own_job_id(tmp_path: Path) -> None:
    known = runrecord.load(_run_dir(tmp_path, [], job_id="100_3", slurm_job_id="104"))
    assert attach.job_to_join(known) == "104"
    (tmp_path / "run" / "run.json").write_text(json.dumps({"run_id": "p", "job_id": "100_3"}))
    point_start = {"event": "point_start", "job": "100_3", "job_id": "105", "time": 1.0}
    (tmp_path / "run" / "events.jsonl").write_text(json.dumps(point_start) + "\n")
    assert attach.job_to_join(runrecord.load(tmp_path / "run")) == "105"
    (tmp_path / "run" / "events.jsonl").unlink()
    assert attach.job_to_join(runrecord.load(tmp_path / "run")) == "100_3"


def test_answers_skip_srun_noise_and_name_silent_ranks() -> None:
    targets = [stacks.Target(0, "n1", 5), stacks.Target(1, "n2", 6)]
    text = 'srun: warning: something\n{"rank": 0, "node": "n1", "pid": 9, "threads": []}\n'
    found = stacks.answers(text, targets)
    assert found[0]["pid"] == 9 and found[1] == {"rank": 1, "node": "n2", "error": "no answer"}


def test_srun_env_drops_the_callers_allocation() -> None:
    env = {"SLURM_CONF": "/c", "SLURM_JOB_ID": "5", "SLURM_NTASKS": "8", "SRUN_X": "1", "A": "b"}
    assert stacks.srun_env(env) == {"SLURM_CONF": "/c", "A": "b"}


def test_node_code_keeps_to_python_36() -> None:
    ast.parse(stacks.NODE_CODE, feature_version=(3, 6))


def _node(ranks: list[list[Any]], pyspy: list[str], path: str) -> list[dict[str, Any]]:
    payload = {"pyspy": pyspy, "ranks": ranks, "any_node": True, "missing": stacks.MISSING}
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", stacks.NODE_CODE, json.dumps(payload)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PATH": path},
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_node_code_without_pyspy_says_so_per_rank() -> None:
    found = _node([[0, "x", os.getpid()], [1, "x", os.getpid()]], [], "/nonexistent")
    assert [f["error"] for f in found] == [stacks.MISSING] * 2
    assert all(f["missing"] for f in found)


@pytest.fixture
def fake_bootstrap(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process named bootstrap.py whose child is a shell whose child is the Python
    program (a wrapper script: the stack is found one level further down)."""
    program = tmp_path / "prog.py"
    program.write_text(
        "import time\n\ndef deep_inside():\n    print('in', flush=True)\n"
        "    time.sleep(60)\n\ndeep_inside()\n"
    )
    boot = tmp_path / "bootstrap.py"
    boot.write_text(
        "import subprocess, sys\n"
        f"subprocess.run(['sh', '-c', '{sys.executable} {program}; true'])\n"
    )
    proc = subprocess.Popen([sys.executable, str(boot)], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"in\n"
    yield proc
    for child in _descendants(proc.pid):
        os.kill(child, signal.SIGTERM)
    proc.terminate()
    proc.wait(timeout=30)


def _descendants(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
            found += [int(child), *_descendants(int(child))]
    return found


@needs_pyspy
def test_node_code_finds_the_program_below_the_bootstrap(
    fake_bootstrap: subprocess.Popen[bytes],
) -> None:
    boot = fake_bootstrap.pid
    # Rank 1: a process with no children that is no bootstrap (not pytest itself: earlier
    # tests may have left it a child).
    with subprocess.Popen(["sleep", "60"]) as other:
        try:
            found = _node([[0, "x", boot], [1, "x", other.pid]], [str(PYSPY)], "/nonexistent")
        finally:
            other.kill()
    assert found[0]["pid"] == _descendants(boot)[1]  # the shell's child
    top = found[0]["threads"][0]["frames"][0]
    assert (top["name"], top["line"]) == ("deep_inside", 5)
    assert found[1]["error"].startswith("its task has ended")  # not a bootstrap


@pytest.fixture
def local_run(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A local 2x2 run of tests/programs/stuck_rank.py, every rank in its function."""
    (tmp_path / "stuck_rank.py").write_text((PROGRAMS / "stuck_rank.py").read_text())
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "USER": "alice",
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "HPCLAUNCH_CLUSTER": "local",
        "LANG": "C.UTF-8",
    }
    argv = ["run", "-N", "2", "--tasks-per-node", "2", "--", sys.executable, "stuck_rank.py"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hpclaunch", *argv, "60"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert launcher.stdout is not None
    seen: list[str] = []
    while sum("ready" in line for line in seen) < 4 and len(seen) < 20:
        seen.append(launcher.stdout.readline())
    assert sum("ready" in line for line in seen) == 4, seen
    time.sleep(0.3)  # from the print to the sleep on the next line
    try:
        yield env
    finally:
        launcher.terminate()
        launcher.wait(timeout=30)


def _hpclaunch(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpclaunch", *args],
        cwd=Path(env["XDG_DATA_HOME"]).parent,  # where the run started: `last` is its project's
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@needs_pyspy
def test_stack_of_a_local_run(local_run: dict[str, str]) -> None:
    shown = _hpclaunch(["stack", "last"], local_run)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "4 ranks, 2 distinct stacks" in shown.stdout
    assert "\nrank 1 (" in shown.stdout and "\nranks 0,2-3 (" in shown.stdout
    assert shown.stdout.count("stuck_here") == 1 and shown.stderr == ""

    one = _hpclaunch(["stack", "last", "--json", "--rank", "1"], local_run)
    data = json.loads(one.stdout)
    assert [g["ranks"] for g in data["groups"]] == [[1]]
    assert data["groups"][0]["threads"][0]["frames"][0]["function"] == "stuck_here"

    for bad, says in ((["--rank", "4"], "has ranks 0 to 3"), (["--rank", "-1"], "has ranks")):
        refused = _hpclaunch(["stack", "last", *bad], local_run)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1 and refused.stdout == ""


@needs_pyspy
def test_missing_pyspy_is_one_hint(
    local_run: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stacks, "pyspy_paths", lambda environ: [])
    monkeypatch.chdir(Path(local_run["XDG_DATA_HOME"]).parent)  # `last`: the run's project
    env = {**local_run, "PATH": "/nonexistent"}
    bare = CliRunner().invoke(cli, ["stack", "last"], env=env, standalone_mode=False)
    assert bare.return_value == 1, bare.output
    hints = [line for line in bare.output.splitlines() if line.startswith("hpclaunch: hint:")]
    assert len(hints) == 1 and "py-spy is missing on" in hints[0], bare.output
    assert "pip install 'hpclaunch[stack]'" in hints[0]
    assert "4 ranks, 0 distinct stacks" in bare.output
    assert "ranks 0-3 (" in bare.output and stacks.MISSING in bare.output


def test_a_finished_run_is_refused(tmp_path: Path) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "HPCLAUNCH_CLUSTER": "local",
    }
    done = subprocess.run(
        [sys.executable, "-m", "hpclaunch", "run", "--", sys.executable, "-c", "pass"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    refused = _hpclaunch(["stack", "last"], env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.startswith("hpclaunch: error: RUN: ")
    assert "has ended: COMPLETED" in refused.stderr and refused.stderr.count("\n") == 1
