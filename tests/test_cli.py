"""The CLI as a user meets it (local backend and dry-runs; no Slurm needed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_lumi_golden import CWD, GOLDEN, RUN_ID

HPCLAUNCH = [sys.executable, "-m", "hpclaunch"]
ID = re.compile(r"\d{8}-\d{6}-\d{3}-[0-9a-f]{4}")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "USER": "alice",
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "HPCLAUNCH_CLUSTER": "local",
        "LANG": "C.UTF-8",
    }


def hpclaunch(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPCLAUNCH, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_lumi_dry_run_prints_the_golden_script_and_writes_nothing(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The acceptance command; the golden file is checked against LUMI.md elsewhere."""
    work = tmp_path / CWD.name  # the project is named after the folder, as in the golden file
    work.mkdir()
    proc = hpclaunch(
        [
            "run",
            "--dry-run",
            "--cluster",
            "lumi",
            "-N",
            "4",
            "--gpus-per-node",
            "8",
            "-p",
            "standard-g",
            "-A",
            "project_465000000",
            "-t",
            "1:00:00",
            "--",
            "python",
            "train.py",
        ],
        work,
        env,
    )
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout.split("\n\n# submit with:")[0] + "\n"
    script = ID.sub(RUN_ID, script).replace(str(work), str(CWD))
    assert script == GOLDEN.read_text()
    assert "sbatch --parsable /scratch/project_465000000/alice/hpclaunch/default/" in proc.stdout
    # No run directory, no index.
    assert list(work.iterdir()) == [] and list(tmp_path.iterdir()) == [work]


def test_dry_run_shows_sbatch_environment(tmp_path: Path, env: dict[str, str]) -> None:
    env = {**env, "SBATCH_ACCOUNT": "project_465000001", "SBATCH_RESERVATION": "AI_day"}
    proc = hpclaunch(
        ["run", "--dry-run", "--cluster", "lumi", "--", "python", "t.py"], tmp_path, env
    )
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --account=project_465000001" in proc.stdout
    assert "#SBATCH --reservation=AI_day" in proc.stdout
    assert "#   SBATCH_ACCOUNT=project_465000001" in proc.stdout


def test_local_run_streams_tagged_lines_and_records_the_run(
    tmp_path: Path, env: dict[str, str]
) -> None:
    proc = hpclaunch(
        [
            "run",
            "-N",
            "2",
            "--tasks-per-node",
            "2",
            "--exp",
            "demo",
            "--",
            sys.executable,
            "-c",
            "import os,sys; print('hi', os.environ['RANK'], os.environ['NODE_RANK']);"
            "print('oops', file=sys.stderr)",
        ],
        tmp_path,
        env,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(re.findall(r"\] hi (\d) (\d)", proc.stdout)) == [
        ("0", "0"),
        ("1", "0"),
        ("2", "1"),
        ("3", "1"),
    ]
    assert proc.stderr.count("] oops") == 4
    listing = hpclaunch(["runs", "--json"], tmp_path / "..", env)
    (row,) = [json.loads(line) for line in listing.stdout.splitlines()]
    assert (row["state"], row["exit_code"], row["exp"]) == ("COMPLETED", 0, "demo")
    run_dir = Path(row["run_dir"])
    assert run_dir.parent == tmp_path / "runs" / "demo"
    for name in ("run.json", "spec.json", "job.sh", "bootstrap.py", "logs", "checkpoints"):
        assert (run_dir / name).exists(), name
    logs = hpclaunch(["logs", "last", "--rank", "3"], tmp_path, env)
    assert logs.stdout.strip().endswith("hi 3 1") and logs.stdout.count("\n") == 1
    assert "oops" in logs.stderr
    status = hpclaunch(["status", row["run_id"][:15]], tmp_path, env)
    assert "COMPLETED" in status.stdout and str(run_dir) in status.stdout


def test_local_exit_code_of_first_failing_rank(tmp_path: Path, env: dict[str, str]) -> None:
    prog = (
        "import os,sys,time; r=int(os.environ['RANK']); time.sleep(0.5*r);"
        "sys.exit(5 if r==1 else 0 if r==0 else 9)"
    )
    proc = hpclaunch(
        ["run", "-N", "1", "--tasks-per-node", "3", "--", sys.executable, "-c", prog], tmp_path, env
    )
    assert proc.returncode == 5, proc.stderr


def test_local_signal_death_gives_128_plus_n(tmp_path: Path, env: dict[str, str]) -> None:
    prog = "import os,signal; os.kill(os.getpid(), signal.SIGKILL)"
    proc = hpclaunch(["run", "--", sys.executable, "-c", prog], tmp_path, env)
    assert proc.returncode == 137, proc.stderr


def test_cancel_of_local_run_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    assert hpclaunch(["run", "--", "true"], tmp_path, env).returncode == 0
    proc = hpclaunch(["cancel", "last"], tmp_path, env)
    assert proc.returncode == 2 and proc.stderr.startswith("hpclaunch: error: RUN: ")


def test_help_explains_every_option_with_an_example(tmp_path: Path, env: dict[str, str]) -> None:
    from hpclaunch.config.options import OPTIONS

    text = hpclaunch(["run", "--help"], tmp_path, {**env, "COLUMNS": "200"}).stdout
    for opt in OPTIONS:
        assert f"--{opt.name}" in text
        # click may wrap anywhere, even at a hyphen: compare without any blanks.
        assert opt.example and re.sub(r"\s", "", opt.example) in re.sub(r"\s", "", text)


def test_usage_errors_use_the_one_line_format(tmp_path: Path, env: dict[str, str]) -> None:
    for args in (["run", "--nodes"], ["nosuchcommand"], ["cancel"], ["run", "--launcher", "x"]):
        proc = hpclaunch(args, tmp_path, env)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith("hpclaunch: error: ") and proc.stderr.count("\n") == 1, (
            args,
            proc.stderr,
        )
        assert "Traceback" not in proc.stderr and "╭" not in proc.stderr


def test_record_masks_secret_env_and_show_prints_it(tmp_path: Path, env: dict[str, str]) -> None:
    proc = hpclaunch(
        ["run", "--env", "MY_TOKEN=tok-123", "--env=A=visible", "--", "true", "tok-arg"],
        tmp_path,
        env,
    )
    assert proc.returncode == 0, proc.stderr
    shown = hpclaunch(["show", "last"], tmp_path, env)
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout.split("\n==> ")[0].split("\n", 1)[1])  # under its label
    assert "MY_TOKEN=***" in record["argv"] and "--env=A=visible" in record["argv"]
    assert record["command"] == ["true", "tok-arg"]
    assert record["hpclaunch_version"]
    assert "tok-123" not in shown.stdout
    assert "#!/bin/bash" in shown.stdout  # the batch script follows the record
    failed = hpclaunch(["run", "--", "false"], tmp_path, env)
    assert failed.returncode == 1
    rows = hpclaunch(["runs", "--json", "--state", "failed"], tmp_path, env).stdout.splitlines()
    assert [json.loads(r)["exit_code"] for r in rows] == [1]


def test_public_api_is_curated_and_lazy() -> None:
    import hpclaunch

    assert set(hpclaunch.__all__) >= {"run", "runs", "get", "UserError", "JobSpec"}
    # The 0.x wrappers are gone (execute() silently dropped reuse_code): run() replaces them.
    assert not {"execute", "RunRequest"} & set(hpclaunch.__all__)
    for name in hpclaunch.__all__:
        assert getattr(hpclaunch, name) is not None
    probe = subprocess.run(
        [sys.executable, "-c", "import hpclaunch, sys; print('hpclaunch.api' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "False"  # importing the package loads nothing heavy
