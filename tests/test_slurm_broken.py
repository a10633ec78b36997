"""A broken Slurm set-up never quietly becomes a local run (issue #28 item 1).

The dead controller is real: the testbed's slurm.conf copied with SlurmctldPort changed
to a port nobody listens on, so the real scontrol retries and gives up (the shared
testbed's daemons are never touched)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import testbed

PROGRAM = ["--", "python3", "-c", "print('trained here')"]


def _dead_conf(tmp_path: Path) -> Path:
    conf = testbed.conf_path()
    if not conf.is_file():
        pytest.skip(f"no testbed slurm.conf at {conf}")
    lines = [
        "SlurmctldPort=6899" if ln.startswith("SlurmctldPort=") else ln
        for ln in conf.read_text().splitlines()
    ]
    dead = tmp_path / "slurm.conf"
    dead.write_text("\n".join(lines) + "\n")
    return dead


def _hpclaunch(
    tmp_path: Path, args: list[str], **env: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    base = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
    }
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hpclaunch", *args],
        cwd=tmp_path,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, time.monotonic() - began


def _runs_written(tmp_path: Path) -> list[Path]:
    return [p for p in tmp_path.rglob("run.json")]


def test_dead_controller_stops_in_one_line_instead_of_running_here(tmp_path: Path) -> None:
    proc, took = _hpclaunch(tmp_path, ["run", *PROGRAM], SLURM_CONF=str(_dead_conf(tmp_path)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "trained here" not in proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpclaunch: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "no Slurm controller answers" in errors[0] and "--cluster local" in errors[0]
    assert "scontrol show config" in errors[0]  # what was tried
    assert "asking the Slurm controller" in proc.stderr  # the wait is said while it lasts
    assert took < 9, took  # bounded: scontrol alone retries a dead controller ~10 s
    assert _runs_written(tmp_path) == []


def test_slurm_conf_naming_a_missing_file_stops(tmp_path: Path) -> None:
    missing = tmp_path / "no-such" / "slurm.conf"
    proc, _ = _hpclaunch(tmp_path, ["run", *PROGRAM], SLURM_CONF=str(missing))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "trained here" not in proc.stdout
    assert f"SLURM_CONF={missing} (no such file)" in proc.stderr
    assert "--cluster local" in proc.stderr
    assert _runs_written(tmp_path) == []


def test_cluster_local_still_runs_here_with_a_dead_controller(tmp_path: Path) -> None:
    dead = str(_dead_conf(tmp_path))
    proc, _ = _hpclaunch(tmp_path, ["run", "--cluster", "local", *PROGRAM], SLURM_CONF=dead)
    assert proc.returncode == 0, proc.stderr
    assert "trained here" in proc.stdout


def test_no_sign_of_slurm_keeps_the_local_default(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # python3 and nothing of Slurm on PATH, no SLURM_CONF
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    proc, _ = _hpclaunch(tmp_path, ["run", *PROGRAM], PATH=str(bin_dir))
    assert proc.returncode == 0, proc.stderr
    assert "trained here" in proc.stdout


def test_doctor_fails_the_controller_line(tmp_path: Path) -> None:
    proc, _ = _hpclaunch(tmp_path, ["doctor"], SLURM_CONF=str(_dead_conf(tmp_path)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0].split()
    assert first[:2] == ["FAIL", "controller"], proc.stdout
    assert "--cluster local" in proc.stdout
