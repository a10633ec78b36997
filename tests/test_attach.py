"""`hpclaunch attach` without Slurm: the refusals, the job and node chosen, the srun
line and its environment, and the command end to end with a stand-in srun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hpclaunch.errors import UserError
from hpclaunch.node import ENV_FD_FLAG, EXEC_FLAG, HPCLAUNCH_CONTAINER_PASS
from hpclaunch.observe import attach
from hpclaunch.payload import containers
from hpclaunch.records import runrecord
from hpclaunch.slurm import commands

RUN_ID = "20260101-120000-000-abcd"


def _run(tmp_path: Path, events: Sequence[dict[str, Any]] = (), **fields: Any) -> Path:
    run_dir = tmp_path / "runs" / "default" / str(fields.pop("run_id", RUN_ID))
    run_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "run_id": run_dir.name,
        "run_dir": str(run_dir),
        "backend": "slurm",
        "job_id": "42",
        "state": "RUNNING",
        "nodes": 2,
        "tasks_per_node": 1,
        "checkpoint_dir": str(run_dir / "checkpoints"),
        "cwd": str(tmp_path),
        "code": {"cwd": str(tmp_path)},
        **fields,
    }
    runrecord.create(run_dir, data)
    lines = [json.dumps({"time": 1.0, **e}) for e in events]
    (run_dir / "events.jsonl").write_text("".join(line + "\n" for line in lines))
    return run_dir


def _started(*nodes: str) -> list[dict[str, Any]]:
    return [{"event": "rank_start", "rank": r, "node": n} for r, n in enumerate(nodes)]


def _load(run_dir: Path) -> runrecord.RunRecord:
    return runrecord.load(run_dir)


def _refusal(run_dir: Path) -> str:
    with pytest.raises(UserError) as caught:
        attach.check_running(_load(run_dir))
    return caught.value.render()


# --- which runs ---------------------------------------------------------------------------


def test_a_running_slurm_job_is_accepted(tmp_path: Path) -> None:
    attach.check_running(_load(_run(tmp_path)))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"state": "COMPLETED"}, f"RUN: {RUN_ID} has already ended (COMPLETED)"),
        ({"state": "TIMEOUT"}, f"RUN: {RUN_ID} has already ended (TIMEOUT)"),
        (
            {"state": "PENDING", "reason": "Priority"},
            f"RUN: {RUN_ID} is pending (PENDING, Priority)",
        ),
        ({"state": "CREATED"}, f"RUN: {RUN_ID} is pending (CREATED)"),
        ({"state": "SUSPENDED"}, f"RUN: {RUN_ID} is SUSPENDED, not running"),
        ({"backend": "local"}, f"RUN: {RUN_ID} is a local run"),
        ({"job_id": None}, f"RUN: {RUN_ID} has no job"),
    ],
)
def test_runs_without_a_running_job_are_refused_in_one_line(
    tmp_path: Path, fields: dict[str, Any], expected: str
) -> None:
    line = _refusal(_run(tmp_path, **fields))
    assert line.startswith(expected), line
    assert "\n" not in line


def test_a_requeued_run_between_attempts_is_pending(tmp_path: Path) -> None:
    events = [
        {"event": "attempt_start", "attempt": 0, "job_id": "42", "nodes": "node[1-2]"},
        {"event": "attempt_end", "attempt": 0, "job_id": "42", "reason": "requeued"},
    ]
    line = _refusal(_run(tmp_path, events, state="PENDING", reason="BeginTime"))
    assert f"{RUN_ID} is pending between two attempts (requeued) (PENDING, BeginTime)" in line


# --- which job, which node ------------------------------------------------------------------


def test_nodes_come_from_the_ranks_events_in_rank_order(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, _started("nodeB", "nodeB", "nodeA", "nodeA"), tasks_per_node=2)
    assert attach.nodes_from_events(_load(run_dir)) == ["nodeB", "nodeA"]
    target = attach.find_target(_load(run_dir), None)
    assert (target.job_id, target.nodes, target.node) == ("42", ("nodeB", "nodeA"), "nodeB")


def test_slurm_is_asked_until_every_node_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[list[str]] = []

    def fake(argv: list[str], **_: Any) -> str:
        asked.append(argv)
        return "42|node[1-2]\n" if argv[0] == "squeue" else "node1\nnode2\n"

    monkeypatch.setattr(commands, "run", fake)
    target = attach.find_target(_load(_run(tmp_path, _started("node1"))), "node2")
    assert (target.nodes, target.node) == (("node1", "node2"), "node2")
    assert asked == [
        ["squeue", "-h", "-j", "42", "-o", "%A|%N"],
        ["scontrol", "show", "hostnames", "node[1-2]"],
    ]


def test_a_node_outside_the_job_is_refused_naming_the_jobs_nodes(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, _started("node1", "node2"))
    with pytest.raises(UserError) as caught:
        attach.find_target(_load(run_dir), "node3")
    assert caught.value.render() == (
        "--node: 'node3' is not a node of job 42 (its nodes: node1, node2). Pick one of them"
    )


def test_no_nodes_listed_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "run", lambda argv, **_: "")
    with pytest.raises(UserError, match="Slurm lists no nodes for job 42"):
        attach.find_target(_load(_run(tmp_path)), None)


def test_the_job_joined_a_chain_member_and_a_sweep_task(tmp_path: Path) -> None:
    chain = [{"event": "attempt_start", "attempt": 1, "job_id": "51", "nodes": "node1"}]
    rec = _load(_run(tmp_path, chain, job_ids=["50", "51", "52"], job_id="50"))
    assert attach.job_to_join(rec) == "51"
    point = _run(tmp_path, run_id="p1", job_id="60_3", sweep_id="s")
    assert attach.job_to_join(_load(point)) == "60_3"  # not known yet: squeue says (%A)
    (point / "events.jsonl").write_text(
        json.dumps({"event": "point_start", "job": "60_3", "job_id": "63"}) + "\n"
    )
    assert attach.job_to_join(_load(point)) == "63"
    runrecord.update(point, slurm_job_id="64")
    assert attach.job_to_join(_load(point)) == "64"


def test_an_array_task_is_joined_by_its_own_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """srun refuses --jobid=60_0 ("Invalid numeric value"): squeue's %A is the task's id."""
    replies = {"squeue": "60|node1\n", "scontrol": "node1\n"}
    monkeypatch.setattr(commands, "run", lambda argv, **_: replies[argv[0]])
    rec = _load(_run(tmp_path, _started("node1"), job_id="60_0", sweep_id="s", nodes=1))
    assert attach.find_target(rec, None).job_id == "60"


# --- the srun line ---------------------------------------------------------------------------

TARGET = attach.Target(RUN_ID, "42", ("node1", "node2"), "node2")
ENV = {"PATH": "/usr/bin:/bin", "SLURM_CONF": "/etc/slurm.conf", "SLURM_JOB_ID": "7", "HOME": "/h"}


def test_a_command_without_a_terminal(tmp_path: Path) -> None:
    rec = _load(_run(tmp_path))
    p = attach.plan_attach(rec, TARGET, ["hostname"], container=False, pty=False, environ=ENV)
    assert p.argv == (
        "srun", "--jobid=42", "--overlap", "--nodes=1", "--ntasks=1", "-w", "node2",
        f"--chdir={tmp_path}", "hostname",
    )  # fmt: skip
    # Another allocation's SLURM_* would be read as this step's options; SLURM_CONF stays.
    assert "SLURM_JOB_ID" not in p.env and p.env["SLURM_CONF"] == "/etc/slurm.conf"
    assert p.env["HPCLAUNCH_RUN_DIR"] == rec.run_dir and p.env["HPCLAUNCH_RUN_ID"] == RUN_ID
    assert p.env["HPCLAUNCH_CHECKPOINT_DIR"] == rec.checkpoint_dir


def test_a_shell_on_a_terminal_is_the_login_shell_under_a_pty(tmp_path: Path) -> None:
    rec = _load(_run(tmp_path))
    env = {**ENV, "SHELL": "/bin/zsh"}
    p = attach.plan_attach(rec, TARGET, [], container=False, pty=True, environ=env)
    assert p.argv[-3:] == ("--pty", "/bin/zsh", "-l")
    p = attach.plan_attach(rec, TARGET, [], container=False, pty=True, environ=ENV)
    assert p.argv[-3:] == ("--pty", "bash", "-l")


def test_the_runs_public_env_and_venv(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    spec = {"env": {"LR": "0.1", "WANDB_API_KEY": "***"}, "venv": "/v", "container": None}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    p = attach.plan_attach(_load(run_dir), TARGET, ["env"], container=False, pty=False, environ=ENV)
    assert p.env["LR"] == "0.1" and "WANDB_API_KEY" not in p.env
    assert p.env["VIRTUAL_ENV"] == "/v" and p.env["PATH"] == "/v/bin:/usr/bin:/bin"


def test_container_refused_for_a_run_without_one(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=f"--container: {RUN_ID} runs without a container"):
        attach.plan_attach(_load(_run(tmp_path)), TARGET, [], container=True, pty=True, environ=ENV)


def _container_spec(image: str, cwd: str) -> dict[str, Any]:
    return {
        "env": {"LR": "0.1", "HF_TOKEN": "***"},
        "venv": "/v",
        "container": {
            "runtime": "charliecloud",
            "command": "ch-run",
            "image": image,
            "binds": [{"src": "/data", "dst": "/d", "ro": False, "origin": "you", "image": False}],
            "flags": [],
            "activate": "",
            "cwd": cwd,
            "pass_env": ["NCCL_*"],
            "mount_points": [],
        },
    }


def test_container_enters_the_image_as_the_tasks_do(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    spec = _container_spec("/images/img", "/work/code")
    (run_dir / "spec.json").write_text(json.dumps(spec))
    rec = _load(run_dir)
    p = attach.plan_attach(rec, TARGET, ["nvidia-smi"], container=True, pty=False, environ=ENV)
    boot = str(run_dir / "bootstrap.py")
    assert p.argv[7:] == (
        "--chdir=/work/code", "bash", "-c", containers.WRAPPER, "hpclaunch-task",
        "ch-run", "--unset-env=*", "--cd=/work/code", "--bind=/data:/d", "/images/img", "--",
        "python3", "-I", "-S", boot, f"{ENV_FD_FLAG}3", EXEC_FLAG, "nvidia-smi",
    )  # fmt: skip
    passed = p.env[HPCLAUNCH_CONTAINER_PASS].split()
    assert {"SLURM_*", "HPCLAUNCH_*", "NCCL_*", "LR", "HF_TOKEN", "TERM"} <= set(passed)
    assert p.env["HPCLAUNCH_VENV"] == "/v" and "VIRTUAL_ENV" not in p.env
    shell = attach.plan_attach(rec, TARGET, [], container=True, pty=True, environ=ENV)
    assert shell.argv[-2:] == (EXEC_FLAG, "bash")  # not a login shell: keeps the venv's PATH


def test_a_sweep_points_spec_and_bootstrap_are_the_sweeps(tmp_path: Path) -> None:
    sweep = tmp_path / "runs" / "default" / "sweep1"
    point = sweep / "points" / "0"
    point.mkdir(parents=True)
    (sweep / "spec.json").write_text(json.dumps(_container_spec("/img", "/c")))
    runrecord.create(
        point,
        {"run_id": "sweep1:0", "run_dir": str(point), "backend": "slurm", "job_id": "9_0",
         "state": "RUNNING", "sweep_id": "sweep1"},
    )  # fmt: skip
    p = attach.plan_attach(_load(point), TARGET, ["true"], container=True, pty=False, environ=ENV)
    assert str(sweep / "bootstrap.py") in p.argv


def test_call_returns_the_exit_code_and_128_plus_a_signal(tmp_path: Path) -> None:
    p = attach.Plan(
        TARGET, ("sh", "-c", "echo out; echo err >&2; exit 6"), dict(ENV), False, False, ()
    )
    assert attach.call(p, capture=True) == (6, "out\n", "err\n")
    p = attach.Plan(TARGET, ("sh", "-c", "kill -TERM $$"), dict(ENV), False, False, ())
    assert attach.call(p, capture=True)[0] == 143


# --- the command, with a stand-in srun ---------------------------------------------------------


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    srun = bin_dir / "srun"  # prints what it got; no squeue here: the record is trusted
    srun.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\necho "dir=$HPCLAUNCH_RUN_DIR"\nexit 4\n')
    srun.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    return subprocess.run(
        [sys.executable, "-m", "hpclaunch", "attach", *args],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _indexed(tmp_path: Path, run_dir: Path) -> None:
    from hpclaunch.records import index

    entry = {"run_id": run_dir.name, "run_dir": str(run_dir), "job_id": "42"}
    index.add(entry, {"XDG_DATA_HOME": str(tmp_path / "data")}, cwd=tmp_path)  # started here


def test_cli_runs_srun_and_exits_with_its_code(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, _started("node1", "node2"))
    _indexed(tmp_path, run_dir)
    proc = _cli(tmp_path, "last", "--node", "node2", "--", "hostname", "--node")
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout.splitlines()[5:] == [
        "node2",
        f"--chdir={tmp_path}",
        "hostname",
        "--node",
        f"dir={run_dir}",
    ]
    proc = _cli(tmp_path, RUN_ID, "--json", "--", "hostname")
    assert proc.returncode == 4, proc.stderr
    shown = json.loads(proc.stdout)
    assert (shown["node"], shown["exit_code"], shown["command"]) == ("node1", 4, ["hostname"])
    assert shown["stdout"].splitlines()[-1] == f"dir={run_dir}"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("last", "--json"), "--json: given without COMMAND"),
        (("last", "--", "true"), f"RUN: {RUN_ID} has already ended (FAILED)"),
        (("nope", "--", "true"), "RUN: no run"),
    ],
)
def test_cli_refusals_are_one_line_exit_2(
    tmp_path: Path, args: tuple[str, ...], expected: str
) -> None:
    run_dir = _run(tmp_path, state="FAILED", exit_code=1)
    _indexed(tmp_path, run_dir)
    proc = _cli(tmp_path, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hpclaunch: error: {expected}"), proc.stderr


def test_an_unknown_state_is_not_called_ended(tmp_path: Path) -> None:
    line = _refusal(_run(tmp_path, state="UNKNOWN"))
    assert line.startswith(f"RUN: {RUN_ID} is UNKNOWN, not running"), line
