"""Errors name what the user gave (hardening, item 8), the demo's environment has what
torch needs (item 9), and the repository root holds no stray Slurm output (item 10)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, VENV_BIN
from hpclaunch.errors import UserError
from hpclaunch.records import index, refs

HPCLAUNCH = str(VENV_BIN / "hpclaunch")


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{VENV_BIN}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "HPCLAUNCH_CLUSTER": "local",
    }
    return subprocess.run(
        [HPCLAUNCH, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def test_runs_state_bogus_names_the_valid_states(tmp_path: Path) -> None:
    proc = _cli(tmp_path, "runs", "--state", "BOGUS")
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert line.startswith("hpclaunch: error: --state: 'BOGUS' is not a state (one of ")
    assert "PENDING" in line and "COMPLETED" in line and "TIMEOUT" in line
    assert _cli(tmp_path, "runs", "--state", "completed").returncode == 0  # any case


def test_logs_rank_beyond_the_run_is_refused(tmp_path: Path) -> None:
    ran = _cli(tmp_path, "run", "-N", "2", "--tasks-per-node", "2", "--", sys.executable, "-V")
    assert ran.returncode == 0, ran.stderr
    proc = _cli(tmp_path, "logs", "last", "--rank", "99")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("hpclaunch: error: --rank: 99 (")
    assert "ranks 0 to 3" in proc.stderr
    assert _cli(tmp_path, "logs", "last", "--rank", "3").returncode == 0


def test_a_job_id_of_several_runs_lists_them(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path)}
    ids = []
    for n in range(3):
        run_dir = tmp_path / f"r{n}"
        run_dir.mkdir()
        run_id = f"20260101-00000{n}-000-abcd"
        index.add({"run_id": run_id, "run_dir": str(run_dir), "job_id": "4242"}, env)
        ids.append(run_id)
    with pytest.raises(UserError) as caught:
        refs.run_dir("4242", env)
    text = str(caught.value)
    assert "job id '4242' belongs to 3 runs" in text
    assert all(run_id in text for run_id in ids)


def test_snapshot_limit_units_name_what_was_given() -> None:
    from hpclaunch.basics.units import parse_size

    assert parse_size("1K", "--snapshot-limit") == 1024
    assert parse_size("2", "--snapshot-limit") == 2 * 2**20  # a plain number is MB


def test_the_demo_environment_has_what_torch_needs() -> None:
    """torch prints "Failed to initialize NumPy" in every rank without numpy: the README's
    first command must install it beside torch."""
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "numpy" in _installed_packages(setup)
    probe = subprocess.run(
        [str(VENV_BIN / "python"), "-c", "import torch; torch.zeros(2).numpy()"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert probe.returncode == 0 and "Failed to initialize NumPy" not in probe.stderr


def test_the_demo_environment_installs_the_plot_extra() -> None:
    """Plots are a headline feature: the README's first command (scripts/demo.sh runs
    scripts/setup.sh) installs hpclaunch with its `plot` extra (matplotlib), with or
    without --test (issue #28 item 9)."""
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "bash scripts/setup.sh" in (REPO / "scripts" / "demo.sh").read_text()
    extras = [line for line in setup.splitlines() if line.strip().startswith(("extras=", "if "))]
    given = [line.split("extras=", 1)[1] for line in extras if "extras=" in line]
    assert given and all("plot" in value for value in given), given
    assert '".${extras}"' in _installed_packages(setup)


def _installed_packages(setup: str) -> str:
    """setup.sh's one list of what it installs (`packages=(...)`), after checking that
    both installers (uv, pip where uv cannot be used) install exactly that list."""
    [packages] = [line for line in setup.splitlines() if line.startswith("packages=(")]
    installs = [line for line in setup.splitlines() if "install" in line and ".venv/bin/" in line]
    uv_and_pip = [line for line in installs if "uv_install.py" in line or "pip install" in line]
    assert len(uv_and_pip) == 2 and all('"${packages[@]}"' in line for line in uv_and_pip)
    return packages


def test_no_stray_slurm_output_in_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "slurm-*.out"], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert tracked.stdout == ""
