"""Finding runs (issue 29): `runs --state` searches every recorded run and `runs` says
when its list is cut, with a NAME column; `last` is this project's (the git work tree,
else the folder), --all-projects anyone's; `status`, `logs` and `show` default to it; a
run folder is a RUN however it is written; `logs --tail N`; states in colour.
Local backend only: no Slurm needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from builders import local_env
from hpclaunch.records import index

PY = sys.executable


def _hpclaunch(cwd: Path, root: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**local_env(root), **extra}
    return subprocess.run(
        [PY, "-m", "hpclaunch", *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _project(root: Path, name: str) -> Path:
    """A git work tree (its top holds .git) with a subfolder."""
    folder = root / name
    (folder / ".git").mkdir(parents=True)
    (folder / "sub").mkdir()
    return folder


def _run_id(proc: subprocess.CompletedProcess[str]) -> str:
    return str(json.loads(proc.stdout.splitlines()[0])["run_id"])


def _recorded(root: Path, number: int, state: str, **fields: Any) -> Path:
    """A run's folder and index line made by hand: an ended local run."""
    run_id = f"20260101-0000{number:02d}-000-{number:04x}"
    folder = root / "runs" / run_id
    folder.mkdir(parents=True)
    record = {
        "run_id": run_id, "run_dir": str(folder), "state": state, "cluster": "local",
        "backend": "local", "exit_code": 0 if state == "COMPLETED" else 1, "exp": "default",
        "command": ["python", "train.py", f"--n={number}"], **fields,
    }  # fmt: skip
    (folder / "run.json").write_text(json.dumps(record))
    index.add({"run_id": run_id, "run_dir": str(folder), "exp": "default"}, local_env(root))
    return folder


def test_runs_state_searches_every_run_and_says_when_the_list_is_cut(tmp_path: Path) -> None:
    _recorded(tmp_path, 0, "FAILED")  # the oldest of 25
    for number in range(1, 25):
        _recorded(tmp_path, number, "COMPLETED")
    proc = _hpclaunch(tmp_path, tmp_path, "runs", "--state", "failed", "--json")
    rows = [json.loads(line) for line in _ok(proc).splitlines()]
    assert [r["run_id"] for r in rows] == ["20260101-000000-000-0000"]
    assert rows[0]["name"] == "python train.py --n=0"
    listed = _hpclaunch(tmp_path, tmp_path, "runs")
    lines = _ok(listed).splitlines()
    assert len(lines) == 21 and lines[0].split()[:7] == [
        "RUN", "JOB", "CLUSTER", "STATE", "EXIT", "EXP", "NAME",
    ]  # fmt: skip
    assert "python train.py --n=24" in lines[1]
    assert "5 older runs not listed: -n 25" in listed.stderr
    assert "older runs" not in _hpclaunch(tmp_path, tmp_path, "runs", "-n", "25").stderr
    named = _recorded(tmp_path, 30, "COMPLETED", job_name="baseline")
    assert "baseline" in _ok(_hpclaunch(tmp_path, tmp_path, "runs", "-n", "1"))
    assert named.name in _ok(_hpclaunch(tmp_path, tmp_path, "runs", "-n", "1"))
    cut = _hpclaunch(tmp_path, tmp_path, "runs", "--state", "COMPLETED", "-n", "4")
    assert len(_ok(cut).splitlines()) == 5 and "21 older runs not listed: -n 25" in cut.stderr


def test_runs_of_an_experiment_with_none_says_so(tmp_path: Path) -> None:
    _recorded(tmp_path, 1, "COMPLETED")
    proc = _hpclaunch(tmp_path, tmp_path, "runs", "--exp", "nosuch")
    assert proc.returncode == 0 and proc.stdout == ""
    assert "no runs in experiment 'nosuch'" in proc.stderr and "no runs yet" not in proc.stderr
    state = _hpclaunch(tmp_path, tmp_path, "runs", "--state", "FAILED")
    assert "no FAILED runs" in state.stderr


def test_last_is_this_projects_newest_run_and_all_projects_anyones(tmp_path: Path) -> None:
    one, two = _project(tmp_path, "one"), _project(tmp_path, "two")
    ran_one = _run_id(
        _hpclaunch(one / "sub", tmp_path, "run", "--json", "--", PY, "-c", "print(1)")
    )
    ran_two = _run_id(_hpclaunch(two, tmp_path, "run", "--json", "--", PY, "-c", "print(2)"))
    # From the first project's subfolder, `last` (and no RUN at all) is its own run.
    for args in (["status", "last"], ["status"], ["show"]):
        assert ran_one in _ok(_hpclaunch(one / "sub", tmp_path, *args)), args
    assert "[vm 0] 1" in _ok(_hpclaunch(one, tmp_path, "logs"))
    assert ran_two in _ok(_hpclaunch(one, tmp_path, "status", "--all-projects"))
    # Outside both projects, `last` names none; the refusal says how to get anyone's.
    elsewhere = _hpclaunch(tmp_path, tmp_path, "status")
    assert elsewhere.returncode == 2 and "--all-projects" in elsewhere.stderr
    # An index line written before projects were recorded: its record's folder decides.
    entries = [
        json.loads(line) for line in index.path(local_env(tmp_path)).read_text().splitlines()
    ]
    assert [e["project"] for e in entries] == [str(one), str(two)]
    index.path(local_env(tmp_path)).write_text(
        "".join(json.dumps({k: v for k, v in e.items() if k != "project"}) + "\n" for e in entries)
    )
    assert ran_one in _ok(_hpclaunch(one / "sub", tmp_path, "status"))


def test_last_inside_a_job_is_still_its_projects(tmp_path: Path) -> None:
    """A job's ranks get $HPCLAUNCH_PROJECT, the project's name (docs/contract.md): an
    hpclaunch command run inside the job (a dev session's terminal, a program that
    submits more) finds its project's `last`, not that of a folder named after it."""
    one = _project(tmp_path, "one")
    program = (
        "import os, subprocess, sys; print(os.environ['HPCLAUNCH_PROJECT'], flush=True);"
        " sys.exit(subprocess.call([sys.executable, '-m', 'hpclaunch', 'status', '--json']))"
    )
    started = _hpclaunch(one / "sub", tmp_path, "run", "--json", "--", PY, "-c", program)
    assert started.returncode == 0, started.stderr
    run_id = _run_id(started)
    tag = "[vm 0] "
    ranks = [line[len(tag) :] for line in started.stderr.splitlines() if line.startswith(tag)]
    assert ranks[0] == "one"  # the contract's variable, as before
    assert json.loads("\n".join(ranks[1:]))["run_id"] == run_id  # the newest: the run itself


def test_cancel_last_cancels_this_projects_running_local_sweep(tmp_path: Path) -> None:
    one, two = _project(tmp_path, "one"), _project(tmp_path, "two")
    env = {**local_env(tmp_path)}
    sweep = subprocess.Popen(
        [PY, "-m", "hpclaunch", "sweep", "--grid", "x=1,2", "--", PY, "-c",
         "import time; time.sleep(60)", "{x}"],
        cwd=one, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not list((one / "runs" / "default").glob("*/points/0/events.jsonl")):
            assert time.monotonic() < deadline and sweep.poll() is None
            time.sleep(0.2)
        _ok(_hpclaunch(two, tmp_path, "run", "--", "true"))  # the newest of any project
        cancelled = _ok(_hpclaunch(one, tmp_path, "cancel", "last"))
        assert cancelled.startswith("cancelled sweep ")
        assert sweep.wait(timeout=60) != 0
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()


def test_a_run_folder_is_a_run_however_it_is_written(tmp_path: Path) -> None:
    run_id = _run_id(_hpclaunch(tmp_path, tmp_path, "run", "--json", "--", PY, "-c", "print(7)"))
    folder = tmp_path / "runs" / "default" / run_id
    assert run_id in _ok(_hpclaunch(folder, tmp_path, "status", "."))
    assert run_id in _ok(_hpclaunch(folder / "logs", tmp_path, "status", ".."))
    assert "[vm 0] 7" in _ok(_hpclaunch(folder.parent, tmp_path, "logs", run_id))
    assert run_id in _ok(_hpclaunch(tmp_path, tmp_path, "show", f"runs/default/{run_id}"))


def test_logs_tail_prints_the_last_lines_so_far(tmp_path: Path) -> None:
    prog = "import sys\nfor i in range(10): print('line', i)\nprint('oops', file=sys.stderr)"
    _ok(_hpclaunch(tmp_path, tmp_path, "run", "--", PY, "-c", prog))
    tail = _hpclaunch(tmp_path, tmp_path, "logs", "--tail", "3")
    assert _ok(tail).splitlines() == ["[vm 0] line 8", "[vm 0] line 9"]
    assert tail.stderr.splitlines() == ["[vm 0] oops"]
    assert _ok(_hpclaunch(tmp_path, tmp_path, "logs", "-n", "0")) == ""
    listed = _ok(_hpclaunch(tmp_path, tmp_path, "logs", "--json", "-n", "2")).splitlines()
    rows = [json.loads(line) for line in listed]  # a listing: one object a line
    assert [(r["node"], r["rank"], r["text"]) for r in rows] == [
        ("vm", 0, "line 9"),
        ("vm", 0, "oops"),
    ]


@pytest.mark.parametrize("no_color", [False, True])
def test_states_are_in_colour_on_a_terminal_only(tmp_path: Path, no_color: bool) -> None:
    """runs and status colour FAILED red and COMPLETED green where stdout is a terminal
    (a pty here), never under NO_COLOR or into a pipe."""
    import pty

    _recorded(tmp_path, 1, "FAILED")
    _recorded(tmp_path, 2, "COMPLETED")
    env = local_env(tmp_path)
    if no_color:
        env["NO_COLOR"] = "1"
    else:
        env.pop("NO_COLOR", None)
    for args in (["runs"], ["status", "20260101-000001"]):
        main, child = pty.openpty()
        proc = subprocess.run(
            [PY, "-m", "hpclaunch", *args], cwd=tmp_path, env=env, stdout=child,
            stderr=subprocess.PIPE, timeout=120, check=False,
        )  # fmt: skip
        os.close(child)
        shown = os.read(main, 65536).decode()
        os.close(main)
        assert proc.returncode == 0, proc.stderr
        red, green = "\x1b[31mFAILED", "\x1b[32mCOMPLETED"
        assert (red in shown) == (not no_color), (args, shown)
        if args == ["runs"]:
            assert (green in shown) == (not no_color), shown
    piped = _ok(_hpclaunch(tmp_path, tmp_path, "runs"))
    assert "\x1b[" not in piped and "FAILED" in piped


def test_over_remote_last_is_the_shipped_projects(tmp_path: Path) -> None:
    """The laptop names the project's mirror on the cluster in every forwarded command;
    there, runs started with it and `last` both use that folder, wherever the command
    runs in it (the mirror holds no .git)."""
    from hpclaunch.records import refs
    from hpclaunch.remote.forward import project_mirror
    from hpclaunch.remote.ship import PROJECTS, mirror_name

    laptop = tmp_path / "laptop"
    (laptop / "sub").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(laptop)], check=True, timeout=60)
    laptop_env = {"XDG_DATA_HOME": str(tmp_path / "laptop-xdg")}
    sent = project_mirror(laptop / "sub", None, laptop_env)
    assert sent == {index.PROJECT_VARIABLE: f"~/{PROJECTS}/{mirror_name(laptop)}"}
    # No git work tree and never shipped from: nothing names a project, `last` is anyone's
    # (a folder shipped with --ship: test_a_folder_shipped_outside_git_names_its_project).
    assert project_mirror(tmp_path, None, laptop_env) == {index.PROJECT_VARIABLE: index.ANY_PROJECT}
    home = tmp_path / "home"
    cluster = {**local_env(tmp_path), "HOME": str(home), **sent}
    mirror = home / PROJECTS / mirror_name(laptop)
    other = _recorded(tmp_path, 1, "COMPLETED")  # an older run of another project
    index.add({"run_id": "20260101-000009-000-0009", "run_dir": str(other)}, cluster, mirror)
    newest = tmp_path / "runs" / "newest"
    (newest / "sub").mkdir(parents=True)
    (newest / "run.json").write_text(json.dumps({"run_id": "20260101-000010-000-0010"}))
    index.add({"run_id": "20260101-000010-000-0010", "run_dir": str(newest)}, local_env(tmp_path))
    assert index.project_of(tmp_path, cluster) == str(mirror)
    assert refs.run_dir("last", cluster) == other
    assert refs.run_dir("last", cluster, all_projects=True) == newest
    anyones = {**cluster, index.PROJECT_VARIABLE: index.ANY_PROJECT}
    assert refs.run_dir("last", anyones) == newest


def test_a_folder_shipped_outside_git_names_its_project(tmp_path: Path) -> None:
    """Issue 29: over --remote `last` is the shipped project's, also for a folder outside
    git shipped with --ship DIR: later commands from that folder (or below it, or from the
    shipped folder) take no --ship, so the laptop remembers, privately, what it shipped
    as and names that mirror; a folder that shipped nothing stays anyone's."""
    from hpclaunch.remote.forward import project_mirror
    from hpclaunch.remote.ship import PROJECTS, mirror_name
    from hpclaunch.remote.shipmemory import memory_path, remember

    laptop_env = {"XDG_DATA_HOME": str(tmp_path / "laptop-xdg")}
    plain, code, elsewhere = tmp_path / "plain", tmp_path / "code", tmp_path / "elsewhere"
    for folder in (plain / "sub", code, elsewhere):
        folder.mkdir(parents=True)
    shipped = project_mirror(plain, "../code", laptop_env)  # `run --ship ../code` from plain
    assert shipped == {index.PROJECT_VARIABLE: f"~/{PROJECTS}/{mirror_name(code)}"}
    anyones = {index.PROJECT_VARIABLE: index.ANY_PROJECT}
    assert project_mirror(plain, None, laptop_env) == anyones  # nothing shipped yet
    remember(plain, code, laptop_env)  # what forward does once the folder shipped
    for here in (plain, plain / "sub", code):
        assert project_mirror(here, None, laptop_env) == shipped, here
    assert project_mirror(elsewhere, None, laptop_env) == anyones
    memory = memory_path(laptop_env)
    assert memory.stat().st_mode & 0o777 == 0o600
    assert memory.parent.stat().st_mode & 0o777 == 0o700
    memory.write_text("not json")  # a damaged memory narrows nothing and fails nothing
    assert project_mirror(plain, None, laptop_env) == anyones


def test_the_apis_remote_run_names_its_project_too(tmp_path: Path) -> None:
    """hpclaunch.run(remote=...) sends the project's mirror as the CLI does, so that
    `hpclaunch --remote HOST status` from the project finds that run as `last`."""
    from hpclaunch.remote.forward import project_mirror
    from hpclaunch.remote.handle import call
    from hpclaunch.remote.ssh import Host

    sent: list[dict[str, Any]] = []

    class Conn:
        host = Host.parse("cluster")

        def run(self, argv: list[str], stdin: bytes, timeout: float = 0) -> Any:
            sent.append(json.loads(stdin))
            return subprocess.CompletedProcess(argv, 0, b"", b"")

    laptop = tmp_path / "laptop"
    laptop.mkdir()
    subprocess.run(["git", "init", "-q", str(laptop)], check=True, timeout=60)
    call(Conn(), ["run", "--", "true"], {}, laptop_cwd=laptop, cwd="x")  # type: ignore[arg-type]
    assert [(one["env"], one["cwd"]) for one in sent] == [(project_mirror(laptop, None, {}), "x")]
