"""Issue 29 (finding runs): `last` is this project's newest run or sweep on every command
that takes RUN or SWEEP, and each of them takes --all-projects for anyone's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click

from builders import local_env
from hpclaunch.cli.group import cli, every_command

PY = sys.executable


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    found = []
    for name, command in sorted(every_command(group).items()):
        if isinstance(command, click.Group):
            found += _commands(command, f"{prefix}{name} ")
        else:
            found.append((f"{prefix}{name}", command))
    return found


def test_every_command_that_takes_a_run_or_sweep_takes_all_projects() -> None:
    takes_ref = {
        name: command
        for name, command in _commands(cli)
        if any(
            isinstance(p, click.Argument) and p.name in ("run", "runs", "sweep")
            for p in command.params
        )
    }
    assert {"status", "logs", "show", "cancel", "rerun", "top", "sweep status"} <= set(takes_ref)
    lacking = [
        name
        for name, command in takes_ref.items()
        if not any("--all-projects" in getattr(p, "opts", ()) for p in command.params)
    ]
    assert lacking == []


def _hpclaunch(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "hpclaunch", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_sweep_of_another_project_is_last_only_with_all_projects(tmp_path: Path) -> None:
    env = local_env(tmp_path)
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    ran = _hpclaunch(there, env, "sweep", "--grid", "x=1,2", "--", PY, "-c", "pass")
    assert ran.returncode == 0, ran.stderr
    mine = _hpclaunch(here, env, "sweep", "status", "last", "--json")
    assert mine.returncode == 2 and "this project" in mine.stderr, mine.stderr
    anyones = _hpclaunch(here, env, "sweep", "status", "--all-projects", "last", "--json")
    assert anyones.returncode == 0, anyones.stderr
    points = json.loads(anyones.stdout)["points"]
    assert [p["state"] for p in points] == ["COMPLETED", "COMPLETED"]
    plot = _hpclaunch(here, env, "top", "--all-projects", "last", "--once")
    assert "this project" not in plot.stderr, plot.stderr
