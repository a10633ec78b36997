"""Logs above the profile's node_logs_above ranks (issue 34): the bootstrap's pump writes
one file a node (lines tagged `[node rank] `) and one exits.jsonl; the follower reads one
rank back from its node's file, shows rank 0 and the warnings and errors of others grouped
(console.py); the digest names the first rank to fail, its last lines and how many ranks
printed the same error. On the testbed: tests/test_e2e_scale_logs.py."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from builders import cli_spec, local_env
from hpclaunch import node
from hpclaunch.config.profiles import Profile
from hpclaunch.errors import UserError
from hpclaunch.observe import jobend, nodelogs
from hpclaunch.observe.console import ConsoleFilter, group_line
from hpclaunch.observe.logs import LogFollower
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script.render import task_env
from test_bootstrap import PY, base_env, boot_cmd

CHATTY = (
    "import sys\n"
    "print('out line')\n"
    "print('err line', file=sys.stderr, flush=True)\n"
    "sys.stdout.write('no newline at the end')\n"
    "sys.exit(int(sys.argv[1]))\n"
)


def _boot(tmp_path: Path, rank: int, node_name: str, code: int, shared: bool = True) -> None:
    program = tmp_path / "chatty.py"
    program.write_text(CHATTY)
    env = base_env(
        HPCLAUNCH_LOG_DIR=str(tmp_path / "logs"),
        SLURM_PROCID=str(rank),
        SLURMD_NODENAME=node_name,
        **({node.HPCLAUNCH_NODE_LOGS: "1"} if shared else {}),
    )
    proc = subprocess.run(boot_cmd(PY, str(program), str(code)), env=env, timeout=60)
    assert proc.returncode == code


def test_the_ranks_of_a_node_share_one_file_of_tagged_lines(tmp_path: Path) -> None:
    _boot(tmp_path, 5, "nid001", 0)
    _boot(tmp_path, 6, "nid001", 3)
    _boot(tmp_path, 7, "nid002", 0)
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.iterdir()) == [
        "exits.jsonl", "node-nid001.log", "node-nid002.log", "ranks.tsv",
    ]  # fmt: skip
    lines = (logs / "node-nid001.log").read_text().splitlines()
    for rank in (5, 6):
        mine = [line for line in lines if line.startswith(f"[nid001 {rank}] ")]
        assert sorted(mine) == sorted(
            f"[nid001 {rank}] {text}" for text in ("out line", "err line", "no newline at the end")
        )
    records = [json.loads(line) for line in (logs / "exits.jsonl").read_text().splitlines()]
    assert [(r["rank"], r["node"], r["returncode"]) for r in records] == [
        (5, "nid001", 0), (6, "nid001", 3), (7, "nid002", 0),
    ]  # fmt: skip
    assert jobend.first_failure(logs) == 3


def test_rank_files_stay_below_the_threshold(tmp_path: Path) -> None:
    _boot(tmp_path, 0, "nid001", 0, shared=False)
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "rank-0.err", "rank-0.exit", "rank-0.out", "ranks.tsv",
    ]  # fmt: skip


def test_node_logs_above_the_profiles_rank_count(tmp_path: Path) -> None:
    assert not cli_spec({"nodes": 8, "tasks_per_node": 8}, "slurm").node_logs  # 64
    spec = cli_spec({"nodes": 13, "tasks_per_node": 5}, "slurm")  # 65
    assert spec.node_logs
    env = dict(task_env(spec, Profile(name="s"), RunPaths("r", tmp_path, tmp_path)))
    assert env[node.HPCLAUNCH_NODE_LOGS] == "1"
    assert Profile(name="s", node_logs_above=0).node_logs_above == 0
    with pytest.raises(UserError) as info:
        Profile.model_validate({"name": "s", "node_logs_above": -1})
    assert "node_logs_above: -1 is not a rank count" in info.value.line()


def _write_node_files(logs: Path) -> None:
    logs.mkdir()
    ranks = [f"{r}\t{'n1' if r < 4 else 'n2'}\t{r % 4}\t{100 + r}\n" for r in range(8)]
    (logs / "ranks.tsv").write_text("".join(ranks))
    oom = "RuntimeError: CUDA out of memory"
    (logs / "node-n1.log").write_text(
        "[n1 0] step 1\n[n1 1] step 1\n[n1 3] Traceback (most recent call last):\n"
        f"[n1 3] {oom}\n[n1 0] step 2\n"
    )
    (logs / "node-n2.log").write_text(
        f"[n2 5] {oom}\n[n2 4] plain line\n[n2 7] {oom}\n[n2 6] UserWarning: slow\n"
    )
    exits = [(3, "n1", 1, 10.0), (5, "n2", 1, 11.0), (7, "n2", 1, 12.0), (0, "n1", -15, 13.0)]
    (logs / "exits.jsonl").write_text(
        "".join(
            json.dumps({"rank": r, "node": n, "returncode": c, "time": t}) + "\n"
            for r, n, c, t in exits
        )
    )


def test_the_console_shows_rank_0_and_groups_the_errors_of_others(tmp_path: Path) -> None:
    _write_node_files(tmp_path / "logs")
    out = io.StringIO()
    follower = LogFollower(tmp_path / "logs", out, io.StringIO(), include_batch=False)
    follower.drain()
    assert out.getvalue().splitlines() == [
        "[n1 0] step 1",
        "[n1 0] step 2",
        "[n1 3] Traceback (most recent call last):",
        "ranks 3, 5, 7 (3 ranks): RuntimeError: CUDA out of memory",
        "[n2 6] UserWarning: slow",
    ]
    assert follower.exited == {0, 3, 5, 7}


def test_one_rank_is_read_back_from_its_nodes_file(tmp_path: Path) -> None:
    _write_node_files(tmp_path / "logs")
    out = io.StringIO()
    LogFollower(tmp_path / "logs", out, io.StringIO(), rank=7, include_batch=False).drain()
    assert out.getvalue().splitlines() == ["[n2 7] RuntimeError: CUDA out of memory"]
    out = io.StringIO()
    LogFollower(tmp_path / "logs", out, io.StringIO(), rank=1, tag=False).drain()
    assert out.getvalue() == "step 1\n"


def test_the_digest_names_the_first_failure_its_lines_and_the_same_error(tmp_path: Path) -> None:
    _write_node_files(tmp_path / "logs")
    assert nodelogs.digest(tmp_path / "logs") == [
        "hpclaunch: rank 3 on n1 failed first (exit 1)",
        "hpclaunch: its last 2 lines:",
        "  Traceback (most recent call last):",
        "  RuntimeError: CUDA out of memory",
        "hpclaunch: ranks 3, 5, 7 (3 ranks) printed: RuntimeError: CUDA out of memory",
    ]
    assert nodelogs.digest(tmp_path / "nothing") == []


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_line_is_held_until_no_rank_joined_it_for_the_window() -> None:
    clock = _Clock()
    console = ConsoleFilter(window_s=1.0, clock=clock)
    assert console.take("n1", 0, "loss 1.0")
    assert not console.take("n1", 5, "just a line")
    for rank in (3, 13, 23, 33, 43, 53, 63, 73):
        assert not console.take("n1", rank, "CUDA out of memory")
        clock.now += 0.5
    assert console.due() == []  # the last rank joined 0.5 s ago
    clock.now += 0.5
    assert console.due() == ["ranks 3, 13, 23 ... (8 ranks): CUDA out of memory"]
    assert console.due(final=True) == []


@pytest.mark.parametrize(
    ("ranks", "line"),
    [([4], "[n 4] x"), ([4, 4], "[n 4] x"), ([9, 2], "ranks 2, 9 (2 ranks): x")],
)
def test_group_line(ranks: list[int], line: str) -> None:
    assert group_line("n", ranks, "x") == line


def test_a_local_label_is_a_file_name(tmp_path: Path, **_: Any) -> None:
    _boot(tmp_path, 1, "", 0)  # no SLURMD_NODENAME: the host name
    [name] = [p.name for p in (tmp_path / "logs").glob("node-*.log")]
    assert "/" not in name and nodelogs.NODE_FILE_RE.match(name)
    assert nodelogs.node_file("vm/node1") == "node-vm_node1.log"


LOCAL_PROGRAM = (
    "import os, sys\n"
    "rank = int(os.environ['RANK'])\n"
    "print('hello from', rank)\n"
    "if rank in (1, 3):\n"
    "    print('RuntimeError: boom', file=sys.stderr)\n"
)


def test_a_local_run_above_the_profiles_key_from_the_project_file(tmp_path: Path) -> None:
    """node_logs_above through the layers (a project file's [clusters.local]): a local
    -N 2 run of 4 ranks writes node files, and the console shows rank 0 and the error
    of ranks 1 and 3 once."""
    (tmp_path / "hpclaunch.toml").write_text("[clusters.local]\nnode_logs_above = 2\n")
    (tmp_path / "prog.py").write_text(LOCAL_PROGRAM)
    argv = [sys.executable, "-m", "hpclaunch", "run", "-N", "2", "--tasks-per-node", "2",
            "--", sys.executable, "prog.py"]  # fmt: skip
    proc = subprocess.run(argv, cwd=tmp_path, env=local_env(tmp_path), capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [logs] = (tmp_path / "runs").glob("*/*/logs")
    names = sorted(p.name for p in logs.iterdir())
    assert names[:1] == ["exits.jsonl"] and names[-1] == "ranks.tsv", names
    assert len([n for n in names if n.startswith("node-")]) == 2 and "rank-0.out" not in names
    assert "hello from 0" in proc.stdout and "hello from 2" not in proc.stdout
    assert proc.stdout.count("RuntimeError: boom") == 1, proc.stdout
    assert "ranks 1, 3 (2 ranks): RuntimeError: boom" in proc.stdout


LAST_WORDS = (
    "import signal, sys, time\n"
    "def term(signum, frame):\n"
    "    print('last words on SIGTERM', flush=True)\n"
    "    sys.exit(3)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)


def test_the_pump_outlives_the_tasks_signal_and_keeps_the_last_words(tmp_path: Path) -> None:
    """Slurm signals every process of a task (srun's end, scancel): the pump ignores it
    and still writes what the program prints as it goes down."""
    program = tmp_path / "last.py"
    program.write_text(LAST_WORDS)
    logs = tmp_path / "logs"
    env = base_env(HPCLAUNCH_LOG_DIR=str(logs), SLURM_PROCID="4", SLURMD_NODENAME="nid7",
                   **{node.HPCLAUNCH_NODE_LOGS: "1"})  # fmt: skip
    boot = subprocess.Popen(boot_cmd(PY, str(program)), env=env, start_new_session=True)
    path = logs / "node-nid7.log"
    deadline = time.monotonic() + 30
    while "ready" not in (path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline and boot.poll() is None
        time.sleep(0.05)
    os.killpg(boot.pid, signal.SIGTERM)  # the task's every process, as Slurm does
    assert boot.wait(timeout=30) == 3
    assert path.read_text().splitlines() == ["[nid7 4] ready", "[nid7 4] last words on SIGTERM"]
    [record] = (logs / "exits.jsonl").read_text().splitlines()
    assert json.loads(record)["returncode"] == 3


def test_a_process_left_holding_the_pipe_holds_the_rank_5_s_at_most(tmp_path: Path) -> None:
    """A program that leaves a process behind with its stdout: the rank ends anyway (the
    bootstrap waits for the pump at most 5 s), its exit record written."""
    program = "import subprocess; subprocess.Popen(['sleep', '20']); print('left one')"
    logs = tmp_path / "logs"
    env = base_env(HPCLAUNCH_LOG_DIR=str(logs), **{node.HPCLAUNCH_NODE_LOGS: "1"})
    start = time.monotonic()
    proc = subprocess.run(boot_cmd(PY, "-c", program), env=env, timeout=60)
    assert proc.returncode == 0 and time.monotonic() - start < 15
    assert len((logs / "exits.jsonl").read_text().splitlines()) == 1
    [node_log] = logs.glob("node-*.log")
    assert node_log.read_text().endswith("] left one\n")
