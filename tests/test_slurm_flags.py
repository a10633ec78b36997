"""Plain Slurm flags as registry rows (options.py, kind "sbatch"): --reservation, --qos,
--constraint, --exclude and --nodelist each come from one row that gives the CLI flag,
the hpclaunch.toml [run] key, the API keyword (test_api keeps the signature equal) and
the #SBATCH line; a bad value is refused in one line before anything is written; a
profile's [sbatch_lines] respells a row's line for its site. The typed options object
(RunOptions) is the registry itself. On the testbed: tests/test_e2e_slurm_flags.py."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

from hpclaunch import api, launching
from hpclaunch.config.options import OPTIONS, SLURM_FLAGS, RunOptions
from hpclaunch.errors import UserError

LUMI = {"cluster": "lumi", "account": "project_465000000", "partition": "small-g"}
FLAGS = [
    ("reservation", "AI_day"),
    ("qos", "normal"),
    ("constraint", "a100&ib"),
    ("exclude", "nid[001-004]"),
    ("nodelist", "nid005,nid006"),
]
BAD = [
    ("reservation", "r s", "a reservation name"),
    ("qos", "high prio", "a QOS name"),
    ("constraint", "a100;rm", "feature names"),
    ("exclude", "node1 node2", "a host list"),
    ("nodelist", "node$1", "a host list"),
]


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "USER": "alice",
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "LANG": "C.UTF-8",
    }


def _script(tmp_path: Path, options: dict[str, Any]) -> str:
    req = api.request(("python", "t.py"), options, cwd=tmp_path, environ=_env(tmp_path))
    return launching.plan_run(req).plan.script


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpclaunch", *args],
        cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip


def test_the_rows_are_the_plain_flags() -> None:
    assert [opt.name for opt in SLURM_FLAGS] == [name for name, _ in FLAGS]
    for opt in SLURM_FLAGS:
        assert opt.line == f"--{opt.name}={{}}" and opt.pattern and opt.allowed


def test_the_typed_options_are_the_registry() -> None:
    """One field per row, in the row's order, typed by its kind; frozen."""
    want = {"int": "Optional[int]", "float": "Optional[float]", "str": "Optional[str]",
            "sbatch": "Optional[str]", "time": "Optional[int]", "mem": "Optional[int]",
            "flag": "<class 'bool'>", "list": "tuple[str, ...]"}  # fmt: skip
    hints = typing.get_type_hints(RunOptions)
    assert list(hints) == [opt.dest for opt in OPTIONS]
    for opt in OPTIONS:
        got = str(hints[opt.dest]).replace("typing.", "")
        choice = "Optional[Literal[" + ", ".join(repr(c) for c in opt.choices) + "]]"
        assert got == want.get(opt.kind, choice), opt.name
    with pytest.raises(AttributeError):
        RunOptions().qos = "x"  # type: ignore[misc]


@pytest.mark.parametrize(("name", "value"), FLAGS)
def test_a_given_flag_is_its_sbatch_line(tmp_path: Path, name: str, value: str) -> None:
    script = _script(tmp_path, {**LUMI, name: value})
    assert f"#SBATCH --{name}={value}\n" in script


@pytest.mark.parametrize(("name", "value"), FLAGS)
def test_the_project_file_key_is_the_same_row(tmp_path: Path, name: str, value: str) -> None:
    (tmp_path / "hpclaunch.toml").write_text(f'[run]\n{name} = "{value}"\n')
    script = _script(tmp_path, LUMI)
    assert f"#SBATCH --{name}={value}\n" in script


def test_the_cli_flags_in_a_dry_run(tmp_path: Path) -> None:
    proc = _cli(
        tmp_path, "run", "--dry-run", "-A", "project_465000000", "--cluster", "lumi",
        *(f"--{name}={value}" for name, value in FLAGS), "--", "python", "t.py",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("#SBATCH --")]
    assert [f"#SBATCH --{name}={value}" for name, value in FLAGS] == [
        line for line in lines if line.split("=")[0].removeprefix("#SBATCH --") in dict(FLAGS)
    ]
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


@pytest.mark.parametrize(("name", "value", "allowed"), BAD)
def test_a_bad_value_is_one_line_and_nothing_is_written(
    tmp_path: Path, name: str, value: str, allowed: str
) -> None:
    proc = _cli(tmp_path, "run", "--cluster", "lumi", "-A", "project_465000000",
                f"--{name}", value, "--", "python", "t.py")  # fmt: skip
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"hpclaunch: error: --{name}: {value!r} is not allowed ({allowed}")
    assert f"Use e.g. --{name} " in line
    assert list(tmp_path.iterdir()) == []


def test_a_bad_value_from_the_project_file_or_the_api(tmp_path: Path) -> None:
    (tmp_path / "hpclaunch.toml").write_text('[run]\nqos = "a b"\n')
    with pytest.raises(UserError, match=r"^--qos: 'a b' is not allowed"):
        _script(tmp_path, LUMI)
    with pytest.raises(UserError, match=r"^--nodelist: 'n\\n1' holds a line break"):
        _script(tmp_path, {**LUMI, "nodelist": "n\n1"})


def test_a_trailing_line_break_from_the_environment_is_refused(tmp_path: Path) -> None:
    """SBATCH_RESERVATION is taken as it is (no CLI conversion): the row's pattern must
    hold for the whole value, or the #SBATCH line would end early."""
    env = {**_env(tmp_path), "SBATCH_RESERVATION": "AI_day\n"}
    req = api.request(("python", "t.py"), LUMI, cwd=tmp_path, environ=env)
    with pytest.raises(UserError, match=r"^--reservation: 'AI_day\\n' is not allowed"):
        launching.plan_run(req)


def test_a_row_is_refused_as_a_raw_sbatch_arg(tmp_path: Path) -> None:
    for raw, flag in (("--qos=high", "--qos"), ("--constraint=a100", "--constraint"),
                      ("--exclude=n1", "--exclude"), ("--nodelist=n1", "--nodelist"),
                      ("-qhigh", "--qos"), ("-Ca100", "--constraint"), ("-xn1", "--exclude"),
                      ("-wn1", "--nodelist")):  # fmt: skip
        with pytest.raises(UserError) as caught:
            _script(tmp_path, {**LUMI, "sbatch_arg": (raw,)})
        assert caught.value.line().endswith(f"Use hpclaunch's {flag} instead")


def test_the_short_flags_are_sbatchs(tmp_path: Path) -> None:
    shorts = ("-q", "normal", "-C", "a100", "-x", "nid001", "-w", "nid002")
    proc = _cli(tmp_path, "run", "--dry-run", "--cluster", "lumi", "-A", "project_465000000",
                *shorts, "--", "true")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for line in ("--qos=normal", "--constraint=a100", "--exclude=nid001", "--nodelist=nid002"):
        assert f"#SBATCH {line}\n" in proc.stdout


def test_a_local_run_names_them_as_ignored(tmp_path: Path) -> None:
    options = {"cluster": "local", "qos": "normal", "nodelist": "n1"}
    req = api.request(("true",), options, cwd=tmp_path, environ=_env(tmp_path))
    notes = launching.plan_run(req).notes
    assert any("--qos, --nodelist do not apply to a local run" in n for n in notes), notes


def test_a_profile_respells_a_line_for_its_site(tmp_path: Path) -> None:
    """A site that wants --gres=gpu:N where others take --gpus-per-node (Slurm's sbatch
    man page: both ask for GPUs; older sites configure only GRES)."""
    (tmp_path / "hpclaunch.toml").write_text(
        '[clusters.lumi.sbatch_lines]\n"gpus-per-node" = "--gres=gpu:{}"\nqos = "--qos={}"\n'
    )
    script = _script(tmp_path, {**LUMI, "gpus_per_node": "2", "qos": "standard"})
    assert "#SBATCH --gres=gpu:2\n" in script and "--gpus-per-node" not in script
    assert "#SBATCH --qos=standard\n" in script


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('nodes = "--nodes={}"', "not an option with an #SBATCH line"),
        ('qos = "--qos=high"', "is not one sbatch option holding one {}"),
        ('qos = "--qos {}"', "is not one sbatch option holding one {}"),
    ],
)
def test_a_bad_spelling_is_refused(tmp_path: Path, table: str, problem: str) -> None:
    (tmp_path / "hpclaunch.toml").write_text(f"[clusters.lumi.sbatch_lines]\n{table}\n")
    with pytest.raises(UserError) as caught:
        _script(tmp_path, LUMI)
    assert caught.value.line().startswith("hpclaunch: error: cluster profile lumi: sbatch_lines.")
    assert problem in caught.value.line()
