"""The CLI supports Python 3.9: install hpclaunch into a 3.9 venv and use it (skipped
where no 3.9 interpreter is on this machine)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from pythons import python_of


def test_cli_on_python39(tmp_path: Path) -> None:
    python = python_of("3.9", needs="venv, ensurepip")
    if python is None:
        pytest.skip("no Python 3.9 interpreter with venv here")
    venv = tmp_path / "v39"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(REPO)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "HPCLAUNCH_CLUSTER": "local",
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
    }
    hpclaunch = str(venv / "bin" / "hpclaunch")
    run = subprocess.run(
        [
            hpclaunch,
            "run",
            "-N",
            "2",
            "--tasks-per-node",
            "2",
            "--",
            "python3",
            "-c",
            "import os; print('rank', os.environ['RANK'])",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert sorted(line.split()[-1] for line in run.stdout.splitlines()) == ["0", "1", "2", "3"]
    dry = subprocess.run(
        [
            hpclaunch,
            "run",
            "--dry-run",
            "--cluster",
            "lumi",
            "-A",
            "project_465000000",
            "--",
            "python",
            "train.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0 and "mask_cpu:0x00fe000000000000" in dry.stdout, dry.stderr
    bad = subprocess.run(
        [hpclaunch, "run", "-N", "0", "--", "x"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("hpclaunch: error: --nodes")
