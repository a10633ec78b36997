"""Each backend renders its own request, chosen once (launching.plan_run): a local --dry-run
shows every rank's command and environment, and that is what the start runs; a step of
an allocation shows its srun line; Slurm the script and sbatch line (tests/golden)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import testbed
from hpclaunch import api, backends, launching
from hpclaunch.backends.base import Launch
from hpclaunch.backends.localplan import JOB_ID, LOCAL_DIR, PORT
from hpclaunch.config import profilekinds
from hpclaunch.records.runrecord import RunRecord

SECRET = "s3cr3t-plan-value-91"
# Each rank writes the environment it got and its argv (as the bootstrap hands it over).
DUMP = (
    "import json, os, sys; r = os.environ['SLURM_PROCID']; "
    "json.dump({'env': dict(os.environ), 'argv': sys.argv[1:]}, open('seen-' + r, 'w'))"
)


def _environ(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPCLAUNCH"))}
    env.update(
        HOME=str(tmp_path / "home"),
        XDG_DATA_HOME=str(tmp_path / "data"),
        XDG_CONFIG_HOME=str(tmp_path / "cfg"),
        HPCLAUNCH_CLUSTER="local",
        MY_TOKEN=SECRET,
    )
    return env


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpclaunch", "run", *args],
        cwd=tmp_path,
        env=_environ(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_local_dry_run_shows_every_ranks_command_and_environment(tmp_path: Path) -> None:
    argv = ["--cluster", "local", "-N", "2", "--tasks-per-node", "2", "--env", "MY_TOKEN",
            "--dry-run", "--", "python3", "train.py", "--key", SECRET]  # fmt: skip
    shown = _cli(tmp_path, *argv)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "#SBATCH" not in text and "sbatch --parsable" not in text  # no batch script
    assert "runs 4 rank(s) (2 node(s) x 2 task(s)) as processes on this machine" in text
    for rank in range(4):
        block = text.split(f"# rank {rank} (node {rank // 2}, local rank {rank % 2}):\n")[1]
        command = block.split("\n# rank")[0]
        assert f"SLURM_PROCID={rank} " in command and f"SLURM_NODEID={rank // 2} " in command
        assert command.rstrip().endswith("python3 train.py --key '$MY_TOKEN'")
    assert "export MASTER_ADDR=127.0.0.1\n" in text
    assert f"export MASTER_PORT='{PORT}'\n" in text and f"export SLURM_JOB_ID='{JOB_ID}'" in text
    assert "export MY_TOKEN='$MY_TOKEN'\n" in text  # the secret reaches the ranks, by name
    assert SECRET not in shown.stdout + shown.stderr
    assert not (tmp_path / "runs").exists()  # a dry-run writes nothing

    as_json = _cli(tmp_path, *argv[:-5], "--json", *argv[-5:])
    assert as_json.returncode == 0, as_json.stderr
    assert SECRET not in as_json.stdout
    ranks = json.loads(as_json.stdout)["ranks"]
    assert [(r["rank"], r["node"], r["local_rank"]) for r in ranks] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)
    ]  # fmt: skip
    for r in ranks:
        assert r["env"]["SLURM_PROCID"] == str(r["rank"]) and r["env"]["MY_TOKEN"] == "$MY_TOKEN"
        assert r["argv"][-4:] == ["python3", "train.py", "--key", "$MY_TOKEN"]


def test_a_local_dry_run_is_what_the_start_runs(tmp_path: Path) -> None:
    """The environment and command the dry-run shows are those every rank gets (but for
    what only the start knows, shown as <...>, and what the task sets itself)."""
    environ = _environ(tmp_path)
    req = api.request(
        ("python3", "-c", DUMP, "{rank}", "a b"),
        {"cluster": "local", "nodes": 2, "tasks_per_node": 2, "env": ["MY_TOKEN"]},
        cwd=tmp_path,
        environ=environ,
    )
    planned = launching.plan_run(req)
    launch = Launch(planned.spec, planned.plan, planned.paths, planned.code.cwd, environ)
    shown = planned.backend.dry_run(launch).data["ranks"]
    started = launching.start(req, planned)
    assert started.paths == planned.paths
    assert launching.finish(started, io.StringIO(), io.StringIO()) == (0, "COMPLETED")
    for rank in shown:
        seen = json.loads((tmp_path / f"seen-{rank['rank']}").read_text())
        fixed = {
            k: v for k, v in rank["env"].items()
            if not v.startswith(("<", "$")) and k != "SLURM_TASK_PID"
        }  # fmt: skip
        assert {k: seen["env"].get(k) for k in fixed} == fixed
        assert seen["env"]["MY_TOKEN"] == SECRET and rank["env"]["MY_TOKEN"] == "$MY_TOKEN"
        assert seen["env"]["SLURM_JOB_ID"] == started.job_id.removeprefix("local-")
        # The bootstrap is what the ranks start; it expands {rank} (node/bootstrap.py).
        assert rank["argv"][-5:] == ["python3", "-c", DUMP, "{rank}", "a b"]
        assert seen["argv"] == [str(rank["rank"]), "a b"]


def test_a_staging_local_dry_run_names_the_folder_made_at_the_start(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("x")
    shown = _cli(tmp_path, "--cluster", "local", "--stage", "data", "--dry-run", "--", "true")
    assert shown.returncode == 0, shown.stderr
    assert f"export HPCLAUNCH_LOCAL='{LOCAL_DIR}'" in shown.stdout


def test_inside_an_allocation_the_dry_run_shows_the_srun_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm_conf = testbed.slurm_conf()  # the file alone stays after testbed/down.sh
    if slurm_conf is None:
        pytest.skip("the testbed is not up (the profile asks scontrol and sinfo)")
    monkeypatch.setenv("SLURM_CONF", str(slurm_conf))  # asked by discover (scontrol, sinfo)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake / "srun").chmod(0o755)
    environ = {**_environ(tmp_path), "SLURM_JOB_ID": "77", "SLURM_CONF": str(slurm_conf)}
    environ["PATH"] = f"{fake}:{environ['PATH']}"
    req = api.request(
        ("python3", "t.py", SECRET), {"cluster": "slurm", "env": ["MY_TOKEN"]},
        cwd=tmp_path, environ=environ,
    )  # fmt: skip
    planned = launching.plan_run(req)
    assert planned.backend.step_of_allocation
    text = launching.preview(planned, environ, as_json=False)
    assert text.startswith("# Inside job 77: no sbatch; the run is one step of this allocation")
    assert "#SBATCH" not in text and "\nsrun \\\n    --kill-on-bad-exit=1" in text
    assert text.rstrip().endswith("python3 t.py '$MY_TOKEN'") and SECRET not in text
    data = json.loads(launching.preview(planned, environ, as_json=True))
    assert data["srun"][0] == "srun" and data["env"]["MY_TOKEN"] == "$MY_TOKEN"


def test_recorded_runs_are_answered_by_their_backend() -> None:
    step = backends.of_record(RunRecord(run_id="r", run_dir="/r", backend="slurm", step=True))
    slurm = backends.of_record(RunRecord(run_id="r", run_dir="/r", backend="slurm"))
    local = backends.of_record(RunRecord(run_id="r", run_dir="/r", backend="local"))
    assert step.step_of_allocation and step.foreground
    assert not slurm.foreground and not slurm.runs_here
    assert local.runs_here and local.foreground
    # kinds.py answers as the classes do (it is asked where the backends cannot be loaded).
    for name in ("local", "slurm"):
        assert profilekinds.runs_here(name) == backends.for_record(name).runs_here
