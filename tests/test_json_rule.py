"""The one JSON rule (docs/json.md), for every command of the click tree: `--json` prints
one JSON object; what lists or streams prints one object per line. The walk fails when
a command has no --json, or none of the cases below (a new command needs both).

The cases run on the local backend (no Slurm): a finished run, a running one (cancel,
stack, top), a local sweep whose points write a result. `attach` joins a Slurm job's
allocation, `dev` gets one and `remote setup` needs a cluster to install on: their JSON
is shown by tests/test_e2e_attach.py, tests/test_e2e_dev.py and, for `remote setup`, the
last test here (the install itself replaced); in the walk each must refuse with its one
error line and nothing on stdout."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import click
import pytest

from builders import local_env
from hpclaunch.cli.group import cli, every_command
from test_stacks import PYSPY

HPCLAUNCH = str(Path(sys.executable).parent / "hpclaunch")
ONE, LINES, REFUSED = "one object", "one object per line", "refused: nothing on stdout"
RESULT = (
    "import json, os, sys; json.dump({'loss': float(sys.argv[1])},"
    " open(os.environ['HPCLAUNCH_RESULT_FILE'], 'w'))"
)
SLEEP = ("python3", "-c", "import time; time.sleep(120)")

# Every command: (its arguments with --json, what its stdout must be).
CASES: dict[str, list[tuple[list[str], str]]] = {
    "run": [(["run", "--json", "--", "echo", "hi"], LINES),
            (["run", "--json", "--dry-run", "--", "true"], ONE)],
    "runs": [(["runs", "--json"], LINES)],
    "status": [(["status", "{run}", "--json"], ONE)],
    "show": [(["show", "{run}", "--json"], ONE)],
    "logs": [(["logs", "{run}", "--json"], LINES)],
    "rerun": [(["rerun", "{run}", "--json", "--dry-run"], ONE),
              (["rerun", "{run}", "--json"], LINES)],
    "env create": [(["env", "create", "--json", "{venv}"], ONE)],
    "image import": [(["image", "import", "--json", "--container-runtime", "pyxis", "nothere"],
                      REFUSED)],
    "env pack": [(["env", "pack", "--json", "{venv}"], ONE)],  # the venv env create made
    "clean": [(["clean", "--json", "--dry-run"], ONE)],
    "doctor": [(["doctor", "--json"], ONE)],
    "plot": [(["plot", "{run}", "--json"], ONE)],
    "top": [(["top", "{running}", "--json"], ONE)],
    "stack": [(["stack", "{running}", "--json"], ONE if PYSPY.exists() else REFUSED)],
    "cancel": [(["cancel", "{running}", "--json"], ONE)],
    "attach": [(["attach", "{run}", "--json", "--", "true"], REFUSED)],
    "dev": [(["dev", "--jupyter", "--json"], REFUSED), (["dev", "--json"], REFUSED)],
    "sweep submit": [(["sweep", "--json", "--grid", "k=1,2", "--", "python3", "-c", RESULT,
                       "{k}"], ONE)],
    "sweep status": [(["sweep", "status", "last", "--json"], ONE),
                     (["sweep", "status", "last", "--points", "--json"], LINES)],
    "sweep wait": [(["sweep", "wait", "last", "--json"], ONE)],
    "sweep retry": [(["sweep", "retry", "last", "--points", "0", "--json"], ONE)],
    "sweep cancel": [(["sweep", "cancel", "last", "--json"], ONE)],
    "sweep throttle": [(["sweep", "throttle", "last", "2", "--json"], ONE)],
    "sweep plot": [(["sweep", "plot", "last", "--x", "k", "--metric", "loss", "--json"], ONE)],
    "sweep wandb-template": [(["sweep", "wandb-template", "--json", "train.py"], ONE)],
    "remote check": [(["remote", "check", "nosuch.invalid", "--json"], ONE)],
    "remote setup": [(["remote", "setup", "nosuch.invalid", "--json"], REFUSED)],
    "rm": [(["rm", "{run}", "--json", "--yes"], ONE)],
    "gc": [(["gc", "--older-than", "0s", "--json", "--yes"], ONE)],
    "profile list": [(["profile", "list", "--json"], LINES)],
    "profile show": [(["profile", "show", "jean-zay", "--json"], ONE)],
    "profile init": [(["profile", "init", "mysite", "--json"], REFUSED)],  # no Slurm here
}  # fmt: skip


def _commands(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, click.Command]]:
    for name, command in every_command(group).items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def test_every_command_takes_json_and_has_a_case() -> None:
    found = dict(_commands(cli))
    lacking = [
        name
        for name, command in found.items()
        if not any(isinstance(p, click.Option) and "--json" in p.opts for p in command.params)
    ]
    assert lacking == [], f"commands without --json: {lacking}"
    assert sorted(found) == sorted(CASES), "a command without a case here (or a case too many)"


def test_docs_json_names_every_command() -> None:
    """docs/json.md says what every command's --json prints: each command is named
    there in backquotes (`sweep` for submitting a sweep)."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "json.md").read_text()
    named = {name: "sweep" if name == "sweep submit" else name for name, _ in _commands(cli)}
    assert [name for name, shown in named.items() if f"`{shown}" not in doc] == []


def _cli(work: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPCLAUNCH, *args], cwd=work, env=local_env(work), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _check(args: list[str], shape: str, shown: subprocess.CompletedProcess[str]) -> None:
    said = f"{args}: rc {shown.returncode}\n{shown.stdout}\n{shown.stderr}"
    if shape == REFUSED:
        assert shown.returncode == 2 and shown.stdout == "", said
        assert shown.stderr.count("\n") == 1, said
        return
    assert shown.returncode in (0, 1), said  # 1: plot without GPU samples, says why
    if shape == ONE:
        assert isinstance(json.loads(shown.stdout), dict), said
        return
    lines = shown.stdout.splitlines()
    assert lines and all(isinstance(json.loads(line), dict) for line in lines), said


def _running(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    started = subprocess.Popen(
        [HPCLAUNCH, "run", "--exp", "sleeping", "--", *SLEEP], cwd=work, env=local_env(work),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = [json.loads(x) for x in _cli(work, ["runs", "--json"]).stdout.splitlines()]
        running = [r for r in listed if r["exp"] == "sleeping" and r["state"] == "RUNNING"]
        if running:
            return started, str(running[0]["run_id"])
        time.sleep(0.3)
    started.kill()
    raise AssertionError("the sleeping run never ran")


def test_every_command_prints_json_by_the_rule(tmp_path: Path) -> None:
    first = _cli(tmp_path, ["run", "--json", "--", "echo", "hi"])
    run_id = json.loads(first.stdout.splitlines()[0])["run_id"]
    sleeper, running = _running(tmp_path)
    names = {"run": run_id, "running": running, "venv": str(tmp_path / "venv")}
    order = [c for c in CASES if c not in ("rm", "gc")] + ["rm", "gc"]  # deleting last
    try:
        for command in order:
            for args, shape in CASES[command]:
                argv = [names.get(a.strip("{}"), a) if a[:1] == "{" else a for a in args]
                _check(argv, shape, _cli(tmp_path, argv))
    finally:
        sleeper.kill()
        sleeper.wait(30)


def test_remote_setup_json_is_one_object_and_its_progress_goes_to_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The walk can only show `remote setup --json` refusing (no cluster to install on,
    and tests/test_e2e_remote.py sets up without --json): here the install answers as
    a successful one would, and stdout is the one object, its progress on stderr."""
    from click.testing import CliRunner

    import hpclaunch.remote.setup as remote_setup

    def installed(host: str, python: str, environ: object, wanted: object, out: TextIO) -> int:
        print(f"hpclaunch: {host}: installed hpclaunch-0.whl into ~/.hpclaunch/venv", file=out)
        return 0

    monkeypatch.setattr(remote_setup, "setup", installed)
    shown = CliRunner().invoke(cli, ["remote", "setup", "login", "--with", "stack", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == {"host": "login", "installed": True, "extras": ["stack"]}
    assert "installed hpclaunch-0.whl" in shown.stderr


def test_logs_follow_json_streams_one_object_per_line_to_the_runs_end(tmp_path: Path) -> None:
    """`logs --follow --json` streams: every line as it comes, one object a line, to the
    run's end, and exits with the run's exit code as `logs --follow` does (its summary
    line, for a person, on stderr); not only the output so far."""
    program = (
        "import sys, time; print('first', flush=True); time.sleep(3); print('second'); sys.exit(3)"
    )
    started = subprocess.Popen(
        [HPCLAUNCH, "run", "--", sys.executable, "-c", program], cwd=tmp_path,
        env=local_env(tmp_path), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not any("first" in p.read_text() for p in tmp_path.rglob("rank-0.out")):
            assert time.monotonic() < deadline and started.poll() is None, "no first line"
            time.sleep(0.1)
        followed = _cli(tmp_path, ["logs", "--follow", "--json"])
        tail = _cli(tmp_path, ["logs", "--follow", "--json", "-n", "1"])  # the run has ended
    finally:
        started.kill()
        started.wait(30)
    rows = [json.loads(line) for line in followed.stdout.splitlines()]
    assert all(set(row) == {"run_id", "node", "rank", "text"} for row in rows), rows
    assert [row["text"] for row in rows if row["rank"] == 0] == ["first", "second"], rows
    assert followed.returncode == 3 and "FAILED, exit code 3" in followed.stderr, followed.stderr
    assert [json.loads(line)["text"] for line in tail.stdout.splitlines()] == ["second"]
    assert tail.returncode == 3, tail.stderr


def test_image_import_json_is_one_object_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk shows `image import --json` refusing only (no runtime here to import
    with; tests/test_e2e_runtimes.py imports without --json): with the import answering
    as a successful one, stdout is the one object docs/json.md names."""
    from click.testing import CliRunner

    from hpclaunch.payload import imports

    def made(runtime: str, source: str, output: object, cwd: Path, name: object) -> object:
        return imports.Imported(where=f"{cwd}/img.sqsh", size=4096, runtime=runtime)

    monkeypatch.setattr(imports, "import_image", made)
    args = ["image", "import", "--json", "--container-runtime", "pyxis", "docker://x"]
    shown = CliRunner().invoke(cli, args)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == {
        "image": f"{Path.cwd()}/img.sqsh", "size": 4096, "runtime": "pyxis"
    }  # fmt: skip
