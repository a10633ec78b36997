"""The typed Python API: a user's script (programs/api_user.py) runs a job through
hpclaunch.run(), waits, reads the result and the logs, finds it again with get("last"),
cancels another; locally and on the Slurm testbed. Wrong types: mypy and UserError."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

import hpclaunch
from conftest import PROGRAMS, REPO, Hpc
from hpclaunch import api
from hpclaunch.config.options import OPTIONS

KIND_TYPES = {
    "int": "Optional[int]",
    "float": "Optional[float]",
    "str": "Optional[str]",
    "sbatch": "Optional[str]",
    "time": "Optional[str]",
    "mem": "Optional[str]",
    "flag": "Optional[bool]",
    "list": "Union[list[str], tuple[str, ...], NoneType]",
}


def _check(seen: dict[str, Any], world: int) -> None:
    assert seen["code"] == 0, seen
    assert seen["state"] == "COMPLETED"
    assert seen["result"] == {"loss": 0.25, "world": world}
    assert f"rank 0 of {world} args ['--lr', '3e-4']" in seen["logs"]
    assert "rank 1 of" in seen["rank1"] and "rank 0 of" not in seen["rank1"]
    assert seen["last"] == seen["id"]
    assert seen["id"] in seen["listed"]
    assert seen["cancelled"] == [143, "CANCELLED"]
    assert seen["wrong_type"].startswith("nodes: '2' is a str (expects an int)")


def test_api_locally(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"), "HPCLAUNCH_CLUSTER": "local"}
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "api_user.py"), "local", "2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # nothing prints unless asked
    _check(json.loads(proc.stdout), world=4)


@pytest.mark.testbed
def test_api_on_the_testbed(hpc: Hpc) -> None:
    proc = hpc.cmd(["python3", str(PROGRAMS / "api_user.py"), "slurm", "2"], timeout=400)
    assert proc.returncode == 0, proc.stderr
    _check(json.loads(proc.stdout), world=4)


def test_signature_equals_the_option_registry() -> None:
    hints = typing.get_type_hints(api.run)
    params = inspect.signature(api.run).parameters
    keywords = [p for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert [p.name for p in keywords] == [o.dest for o in OPTIONS] + list(api._API_ONLY)
    for opt in OPTIONS:
        assert params[opt.dest].default is None
        want = KIND_TYPES.get(opt.kind) or (
            "Optional[Literal[" + ", ".join(repr(c) for c in opt.choices) + "]]"
        )
        got = str(hints[opt.dest]).replace("typing.", "").replace("collections.abc.", "")
        assert got == want, opt.name


@pytest.mark.parametrize(
    ("kwargs", "line"),
    [
        ({"nodes": "2"}, "nodes: '2' is a str (expects an int)"),
        ({"nodes": True}, "nodes: True is a bool (expects an int)"),
        ({"env": "A=1"}, "env: 'A=1' is a str (expects a list of strings)"),
        ({"exclusive": 1}, "exclusive: 1 is an int (expects a bool)"),
    ],
)
def test_wrong_types_are_user_errors(kwargs: dict[str, Any], line: str) -> None:
    with pytest.raises(hpclaunch.UserError) as caught:
        hpclaunch.run(["true"], cluster="local", **kwargs)
    assert str(caught.value).startswith(line)


def test_wrong_types_are_mypy_errors() -> None:
    # One mypy run for both files (each run checks hpclaunch itself: ~15 s of CPU): the
    # well-typed file has no error, each line of the other one error.
    folder = REPO / "tests" / "typecheck"
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         str(folder / "api_right_types.py"), str(folder / "api_wrong_types.py")],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
    )  # fmt: skip
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert not [e for e in errors if "api_right_types.py" in e], checked.stdout
    assert [e.split(":")[:2] for e in errors] == [
        ["tests/typecheck/api_wrong_types.py", line] for line in ("5", "6", "7", "8")
    ], checked.stdout
