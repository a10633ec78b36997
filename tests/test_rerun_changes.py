"""`rerun RUN` with changed resources and environment (local backend; the Slurm side is
tests/test_e2e_rerun.py): the recorded options with the given ones on top, checked as
`run` checks them, declared by run's own rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from click.testing import CliRunner

from builders import local_env
from test_cli import hpclaunch

SHOW = (
    "import os; print('seen', os.environ['WORLD_SIZE'], os.environ.get('COLOUR', '-'),"
    " os.environ.get('SHAPE', '-'))"
)


def _runs(work: Path) -> list[Path]:
    return sorted((work / "runs" / "default").iterdir())


def test_rerun_changes_nodes_tasks_env_and_setup_and_keeps_the_program(tmp_path: Path) -> None:
    env = local_env(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    first = hpclaunch(
        ["run", "--wait", "--env", "COLOUR=red", "--env", "SHAPE=box", "--", sys.executable,
         "-c", SHOW],
        work, env,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert "seen 1 red box" in first.stdout
    again = hpclaunch(
        ["rerun", _runs(work)[0].name, "--wait", "-N", "2", "--tasks-per-node", "2",
         "--env", "COLOUR=blue", "--setup", "echo setup-ran-again", "-t", "5"],
        work, env,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("seen 4 blue box") == 4, again.stdout  # SHAPE kept, COLOUR new
    second = json.loads((_runs(work)[1] / "run.json").read_text())
    assert second["command"] == [sys.executable, "-c", SHOW]
    assert second["options"]["nodes"] == "2" and second["options"]["time"] == "5"
    assert second["options"]["env"] == ["SHAPE=box", "COLOUR=blue"]
    assert "setup-ran-again" in (_runs(work)[1] / "job.sh").read_text()


def test_rerun_refuses_a_bad_value_as_run_does_and_submits_nothing(tmp_path: Path) -> None:
    env = local_env(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    assert hpclaunch(["run", "--wait", "--", "true"], work, env).returncode == 0
    for bad in (["-N", "0"], ["-t", "0"], ["--tasks-per-node", "many"], ["--env", "1X=y"]):
        by_run = hpclaunch(["run", *bad, "--", "true"], work, env)
        by_rerun = hpclaunch(["rerun", "last", *bad], work, env)
        assert by_rerun.returncode == by_run.returncode == 2, (bad, by_rerun.stderr)
        errors = [line for line in by_rerun.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and "Traceback" not in by_rerun.stderr, by_rerun.stderr
        assert errors == by_run.stderr.splitlines(), bad
    assert len(_runs(work)) == 1  # nothing submitted, nothing left behind


def test_rerun_declares_its_options_by_runs_rows() -> None:
    from hpclaunch.cli.control import RERUN_OPTIONS, rerun_cmd
    from hpclaunch.cli.run_cmd import run_cmd

    def helps(command: click.Command) -> dict[str, str]:
        return {p.opts[0]: (p.help or "") for p in command.params if isinstance(p, click.Option)}

    of_run, of_rerun = helps(run_cmd), helps(rerun_cmd)
    for name in RERUN_OPTIONS:
        assert of_rerun[f"--{name}"] == of_run[f"--{name}"], name
    shown = CliRunner().invoke(rerun_cmd, ["--help"]).output
    for flag in ("-N", "-t", "-p", "-A", "--gpus-per-node", "--env", "--setup"):
        assert flag in shown, flag


def test_changes_go_on_top_of_the_recorded_options() -> None:
    from hpclaunch.cli.control import with_changes

    recorded = {"nodes": "1", "env": ("A=1", "B=2"), "setup": ("module load x",), "exp": "e"}
    changed = with_changes(
        recorded, {"nodes": "4", "env": ("B=3", "C"), "setup": ("echo hi",), "time": None}
    )
    assert changed == {
        "nodes": "4",
        "env": ("A=1", "B=3", "C"),
        "setup": ("module load x", "echo hi"),
        "exp": "e",
    }
    assert with_changes(recorded, {"nodes": None, "env": ()}) == recorded
