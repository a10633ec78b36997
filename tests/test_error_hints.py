"""Errors that point the right way (issue 29): an unknown option names the command typed
and the closest option, a mistyped sweep subcommand is no program, `-t 0:05` is refused,
grid values lose the blanks around them and a grid no argument names warns, the API's
empty program speaks Python. Local backend and dry-runs only: no Slurm needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from builders import local_env
from hpclaunch.errors import UserError
from hpclaunch.sweeps.gridnames import env_only_note
from hpclaunch.sweeps.points import Point, parse_grid


def _hpclaunch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpclaunch", *args], cwd=tmp_path, env=local_env(tmp_path),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("hpclaunch: error: ") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr
    return proc.stderr


@pytest.mark.parametrize(
    ("args", "command", "closest"),
    [
        (["runs", "--stat", "FAILED"], "runs", "--state"),
        (["sweep", "status", "x", "--metrc", "loss"], "sweep status", "--metric"),
        (["sweep", "--gird", "x=1,2", "--", "true"], "sweep", "--grid"),
        (["logs", "--rnak", "0"], "logs", "--rank"),
        (["run", "--nodez", "2", "--", "true"], "run", "--nodes"),
    ],
)
def test_an_unknown_option_names_the_command_typed_and_the_closest_option(
    tmp_path: Path, args: list[str], command: str, closest: str
) -> None:
    line = _one_error_line(_hpclaunch(tmp_path, *args))
    assert f"{_typo(args)}: unknown option" in line
    assert f"Did you mean {closest}?" in line
    assert f"See hpclaunch {command} --help" in line
    # Only the commands that take a program are told where the program goes.
    assert ("put the program after --" in line) == (command in ("run", "sweep"))


def _typo(args: list[str]) -> str:
    return next(a for a in args if a.startswith("--"))


def test_an_unknown_option_with_nothing_close_offers_no_guess(tmp_path: Path) -> None:
    line = _one_error_line(_hpclaunch(tmp_path, "runs", "--zzzzzz"))
    assert "Did you mean" not in line and "See hpclaunch runs --help" in line


def test_a_mistyped_command_reads_as_one_sentence_per_hint(tmp_path: Path) -> None:
    line = _one_error_line(_hpclaunch(tmp_path, "rnus"))
    assert "No such command 'rnus'. Did you mean 'runs'? See hpclaunch --help" in line


def test_a_mistyped_sweep_subcommand_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    line = _one_error_line(_hpclaunch(tmp_path, "sweep", "stats", "last"))
    assert "no subcommand 'stats'" in line and "Did you mean hpclaunch sweep status?" in line
    assert not (tmp_path / "runs").exists()  # nothing was taken as a program to sweep


LUMI = ["--cluster", "lumi", "-p", "small-g", "-A", "project_465000000", "--dry-run"]


@pytest.mark.parametrize("seconds", ["0:05", "0:59", "00:00:30"])
def test_seconds_are_refused_as_a_slurm_time_limit_like_zero(tmp_path: Path, seconds: str) -> None:
    """Slurm rounds 0:05 up to a minute, and -t 0 means no limit there: one line naming
    the field, the value, the limit and the fix, nothing written (a local run keeps its
    seconds: test_local_hardening times out a run of -t 0:02)."""
    line = _one_error_line(_hpclaunch(tmp_path, "run", *LUMI, "-t", seconds, "--", "true"))
    assert line.startswith(f"hpclaunch: error: --time: 00:00:{int(seconds[-2:]):02d} is ")
    assert "(at least 1 minute: Slurm rounds seconds up to whole minutes)" in line
    assert "Give whole minutes, e.g. -t 1" in line
    assert not (tmp_path / "runs").exists()
    minute = _hpclaunch(tmp_path, "run", *LUMI, "-t", "0:60", "--", "true")
    assert minute.returncode == 0 and "#SBATCH --time=00:01:00" in minute.stdout, minute.stderr


def test_grid_values_lose_the_blanks_around_them() -> None:
    assert parse_grid("lr=0.1, 0.2") == ("lr", ("0.1", "0.2"))
    assert parse_grid("opt=adam ,sgd") == ("opt", ("adam", "sgd"))
    with pytest.raises(UserError, match=r"gives '0\.1' twice"):
        parse_grid("lr=0.1, 0.1")


def test_a_grid_no_argument_names_warns_that_it_reaches_the_program_by_environment() -> None:
    points = [Point(0, {"lr": "0.1", "bs": "1"})]
    note = env_only_note(["python", "train.py", "--bs", "{bs}"], points, ["lr=0.1", "bs=1"])
    assert note.startswith("hpclaunch: warning: --grid lr:") and "\n" not in note
    assert "HPCLAUNCH_PARAM_LR" in note and "{lr}" in note and "bs" not in note.split(":")[2]
    named = ["python", "train.py", "--lr", "1", "--bs={bs}"]  # a flag's name is enough
    assert env_only_note(named, points, ["lr=0.1", "bs=1"]) == ""
    assert env_only_note(["python", "t.py"], [Point(0, {"x": "1"})], ["x=1"]) != ""


def test_a_sweep_warns_once_on_stderr_for_a_grid_no_argument_names(tmp_path: Path) -> None:
    proc = _hpclaunch(tmp_path, "sweep", "--dry-run", "--grid", "lr=0.1, 0.2", "--", "true")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "--grid lr" in line]
    assert len(warnings) == 1 and "HPCLAUNCH_PARAM_LR" in warnings[0]
    assert "lr=0.2" in proc.stdout and "lr=' 0.2'" not in proc.stdout
    quiet = _hpclaunch(tmp_path, "sweep", "--dry-run", "--grid", "lr=1,2", "--", "echo", "{lr}")
    assert quiet.returncode == 0 and "--grid lr" not in quiet.stderr


@pytest.mark.parametrize("program", [[], (), ""])
def test_the_apis_empty_program_is_refused_in_pythons_words(
    tmp_path: Path, program: object
) -> None:
    import hpclaunch

    with pytest.raises(UserError) as caught:
        hpclaunch.run(program, cluster="local", cwd=tmp_path, environ=local_env(tmp_path))  # type: ignore[arg-type]
    line = caught.value.render()
    assert line.startswith("program: ") and "hpclaunch.run(['python', 'train.py'])" in line
    assert "--" not in line
