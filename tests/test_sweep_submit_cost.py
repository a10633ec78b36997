"""What a held sweep's submission spends outside Python (issue 26, Performance: a held
1,000-point sweep to its printed id against submitit's whole process). Behaviour, not
timing: how many git calls, which processes wait on which, what is compiled."""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpclaunch.payload import project, snapshot


def _git(cwd: Path, *args: str) -> None:
    ident = ["-c", "user.name=t", "-c", "user.email=t@localhost"]
    subprocess.run(["git", *ident, *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    (tmp_path / "train.py").write_text("print(1)\n")
    _git(tmp_path, "add", "train.py")
    _git(tmp_path, "commit", "-q", "-m", "init")
    return tmp_path


def _git_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    real = subprocess.run

    def counting(argv: Any, *args: Any, **kwargs: Any) -> Any:
        words = list(argv)
        if words[:1] == ["git"]:  # its subcommand: the first word after the -c pairs
            rest = [w for i, w in enumerate(words[1:]) if not w.startswith("-")]
            rest = [w for w in rest if words[words.index(w) - 1] != "-c"]
            calls.append(rest[:1])
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", counting)
    return calls


def test_a_clean_tree_costs_one_git_call_for_its_diff(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The diff of a clean tree was three git calls (the index's path, HEAD, the diff)
    and a copy of the index: one status call now says there is nothing to diff."""
    calls = _git_calls(monkeypatch)
    assert snapshot.diff(repo) == ""
    assert calls == [["status"]]


def test_a_dirty_tree_still_gives_its_diff(repo: Path) -> None:
    (repo / "train.py").write_text("print(2)\n")
    assert "+print(2)" in snapshot.diff(repo)
    _git(repo, "add", "train.py")  # staged only
    assert "+print(2)" in snapshot.diff(repo)


def test_git_state_is_one_call(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True)
    calls = _git_calls(monkeypatch)
    assert project.git_state(repo) == {"commit": head.stdout.strip(), "dirty": False}
    (repo / "train.py").write_text("print(3)\n")
    assert project.git_state(repo)["dirty"] is True
    assert calls == [["status"], ["status"]]


def test_git_state_before_the_first_commit_and_outside_git(tmp_path: Path) -> None:
    assert project.git_state(tmp_path) == {}
    _git(tmp_path, "init", "-q")
    assert project.git_state(tmp_path) == {}


def test_the_bootstrap_bytecode_is_copied_not_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiling the shipped bootstrap (1,200 lines) again for every sweep and run: its
    installed bytecode (pip compiles at install) is copied, stamped for the copy, and
    Python's loader takes it as it is."""
    import importlib.machinery
    import py_compile
    import shutil

    from hpclaunch import node
    from hpclaunch.script import runfolder

    origin = tmp_path / "pkg" / node.BOOTSTRAP
    origin.parent.mkdir()
    shutil.copyfile(node.path(node.BOOTSTRAP), origin)
    py_compile.compile(str(origin), doraise=True)
    shipped = tmp_path / "run" / node.BOOTSTRAP
    shipped.parent.mkdir()
    shutil.copyfile(origin, shipped)

    def no_compile(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("compiled again")

    monkeypatch.setattr(py_compile, "compile", no_compile)
    runfolder.precompile(shipped, origin)
    loader = importlib.machinery.SourceFileLoader("bootstrap", str(shipped))
    monkeypatch.setattr(loader, "source_to_code", no_compile)  # only the pyc may serve
    code = loader.get_code("bootstrap")
    assert code is not None and code.co_filename == str(shipped)


def test_stale_bytecode_is_not_copied(tmp_path: Path) -> None:
    """An installed pyc that no longer matches its source (edited in place) is not
    shipped: the copy is compiled from its own text."""
    import importlib.util
    import py_compile

    from hpclaunch.script import runfolder

    origin, shipped = tmp_path / "a.py", tmp_path / "b.py"
    origin.write_text("X = 1\n")
    py_compile.compile(str(origin), doraise=True)
    origin.write_text("X = 22\n")  # another size: the pyc is stale
    shipped.write_text("X = 22\n")
    runfolder.precompile(shipped, origin)
    cached = Path(importlib.util.cache_from_source(str(shipped)))
    namespace: dict[str, Any] = {}
    exec(marshal.loads(cached.read_bytes()[16:]), namespace)
    assert namespace["X"] == 22


def _slow_slurm(folder: Path, monkeypatch: pytest.MonkeyPatch, delay: float) -> Path:
    """scontrol, sinfo, sacctmgr and sbatch that each take `delay` seconds to answer,
    first on PATH; each writes its name and when it started and ended to the log returned."""
    folder.mkdir()
    log = folder / "asked.log"
    answers = {
        "scontrol": "ClusterName = slow\nMaxArraySize = 1001\n",
        "sinfo": "debug*|infinite|2|4|(null)|1000|1-infinite|0|n/a\n",
        "sacctmgr": "",
        "sbatch": "4242",  # --parsable: the array's job id
    }
    for name, text in answers.items():
        tool = folder / name
        tool.write_text(
            f"#!/bin/sh\nstarted=$(date +%s.%N)\nsleep {delay}\n"
            f'echo "{name} $started $(date +%s.%N)" >> {log}\n'
            f"printf '%s' '{text}'\n"
        )
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return log


def _overlapping(log: Path) -> list[str]:
    """The tools asked, in order, checked to have waited together: each started before
    any of them ended (one after the other, the second starts after the first ends),
    whatever the machine's load."""
    asked = [line.split() for line in log.read_text().splitlines()]
    assert max(float(started) for _, started, _ in asked) < min(
        float(ended) for _, _, ended in asked
    ), asked
    return sorted(name for name, _, _ in asked)


def test_the_controller_and_the_partitions_are_asked_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scontrol show config, then sinfo, each waiting on slurmctld in turn: both queries
    now wait together (a sweep's and a run's planning asks both)."""
    from hpclaunch.config.profiles import Profile
    from hpclaunch.planning import preparing
    from hpclaunch.slurm import discover

    log = _slow_slurm(tmp_path / "bin", monkeypatch, 1.0)
    discover.slurm_config.cache_clear()
    discover.partitions.cache_clear()
    try:
        profile = preparing._with_discovered(Profile(name="slow", discover=True))
    finally:
        discover.slurm_config.cache_clear()
        discover.partitions.cache_clear()
    assert profile.cluster_name == "slow" and "debug" in profile.partitions
    assert _overlapping(log) == ["scontrol", "sinfo"]


# What submitting a sweep imports (cli/sweep_cmd.submit_cmd, sweeps/submit.start) and
# modules it must not import: each costs the interpreter's start before the sweep id.
SUBMIT_IMPORTS = (
    "hpclaunch.cli.main, hpclaunch.cli.group, hpclaunch.cli.sweep_cmd, hpclaunch.api, "
    "hpclaunch.sweeps.submit, hpclaunch.cli.sweep_report"
)
NOT_ON_THE_PATH = ("tarfile", "pydantic", "difflib")


def test_submitting_a_sweep_imports_no_tarfile() -> None:
    """tarfile (node/stage_guard's link check, in jobs only) came with launching's
    imports into every submission; pydantic (profiles) and difflib stay out as well."""
    probe = f"import sys, {SUBMIT_IMPORTS}; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "hpclaunch.sweeps.submit" in loaded
    assert [name for name in NOT_ON_THE_PATH if name in loaded] == []


def test_sacctmgr_is_asked_with_the_controller_and_the_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep's MaxSubmitJobs question (sacctmgr) waited after planning's scontrol and
    sinfo: it goes in the same round now (sweeps/limits.asking_limits, slurm/along.py)."""
    from hpclaunch import launching
    from hpclaunch.config.profiles import Profile
    from hpclaunch.planning import preparing
    from hpclaunch.slurm import discover
    from hpclaunch.sweeps import limits

    log = _slow_slurm(tmp_path / "bin", monkeypatch, 1.0)
    environ = {**os.environ, "USER": "someone"}
    req = launching.LaunchRequest({}, ("true",), tmp_path, environ)
    discover.slurm_config.cache_clear()
    discover.partitions.cache_clear()
    try:
        with limits.asking_limits(environ):
            preparing._with_discovered(Profile(name="slow", discover=True))
        found = limits.site_limits(req)
    finally:
        discover.slurm_config.cache_clear()
        discover.partitions.cache_clear()
    assert (found.max_array_size, found.max_submit_jobs) == (1001, None)
    assert _overlapping(log) == ["sacctmgr", "scontrol", "sinfo"]


def test_nothing_is_asked_along_where_planning_asks_no_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan that asks Slurm nothing (a local run) starts no sacctmgr either, and what
    was wanted is forgotten after the block."""
    from hpclaunch.slurm import along

    asked: list[list[str]] = []
    monkeypatch.setattr(along.commands, "query", lambda argv, timeout: asked.append(argv))
    with along.asked_along(["sacctmgr", "x"], 1.0):
        pass
    along.start()
    assert asked == [] and along._ASKED == {}


def _held_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A held 3 x 2 grid sweep submitted by the CLI to stand-in Slurm tools; its folder."""
    import json

    from hpclaunch.cli.main import main

    _slow_slurm(tmp_path / "bin", monkeypatch, 0)
    for name in [k for k in os.environ if k.startswith(("SLURM", "HPCLAUNCH"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    argv = ["sweep", "--cluster", "slurm", "--run-root", str(tmp_path / "runs"), "--json"]
    argv += ["--grid", "a=1,2,3", "--grid", "b=x,y", "--sbatch-arg=--hold", "--no-snapshot"]
    with pytest.raises(SystemExit) as done:
        main([*argv, "--", "python3", "train.py", "{a}", "{b}"])
    assert done.value.code in (0, None)
    record = tmp_path / "runs" / "default"
    (sweep_dir,) = record.iterdir()
    assert json.loads((sweep_dir / "sweep.json").read_text())["arrays"][0]["job_id"] == "4242"
    return sweep_dir


def test_a_held_sweep_makes_no_point_folders_and_a_writer_makes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder per point was 1,000 mkdirs of a held 1,000-point submission (0.2-0.5 s
    on the shared machine's file system, more than its imports): an array point's task
    makes its folder when it starts. Until then its record comes from sweep.json, and a
    host-side writer (a status change, a cancel, a retry) makes the folder first, with
    the mode of the sweep's points/ folder whatever the umask."""
    from hpclaunch.records import runrecord, sweeprecord

    sweep_dir = _held_sweep(tmp_path, monkeypatch)
    points = sweep_dir / "points"
    assert os.listdir(points) == []
    assert runrecord.read_raw(points / "4")["job_id"] == "4242_4"
    old = os.umask(0o022)
    try:
        runrecord.update(points / "4", state="CANCELLED")
        sweeprecord.keep_attempt(points / "5", 1)
    finally:
        os.umask(old)
    assert runrecord.read_raw(points / "4")["state"] == "CANCELLED"
    assert (points / "5" / "logs").is_dir()
    for point in ("4", "5"):
        assert (points / point).stat().st_mode & 0o777 == points.stat().st_mode & 0o777 == 0o700
    with pytest.raises(OSError):  # no sweep there: no folder made for it
        runrecord.update(tmp_path / "runs" / "nothing" / "points" / "1", state="X")
    assert not (tmp_path / "runs" / "nothing").exists()


def test_an_array_task_makes_its_point_folder_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The array script's own lines make the point's folder, logs/ and checkpoints/ with
    the run's mode under the job's own (wider) umask."""
    sweep_dir = _held_sweep(tmp_path, monkeypatch)
    lines = (sweep_dir / "job.sh").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("unset HPCLAUNCH_RC"))
    end = next(i for i, line in enumerate(lines) if "mkdir -p -m" in line)
    probe = "umask 022\n" + "\n".join(lines[start : end + 1])
    env = {"PATH": os.environ["PATH"], "SLURM_ARRAY_TASK_ID": "2"}
    subprocess.run(["bash", "-c", probe, "job.sh", "3"], env=env, check=True)
    point = sweep_dir / "points" / "5"  # offset 3 + task 2
    for folder in (point, point / "logs", point / "checkpoints"):
        assert folder.stat().st_mode & 0o777 == 0o700, folder


# Modules a held grid sweep's whole command imported and never used (issue 26: the
# interpreter's start is most of the time to the sweep id): difflib for a mistyped
# subcommand; secrets and hashlib (OpenSSL) for ids, ssh and pack names; tempfile and
# random, socket for functions a held sweep never calls.
NOT_ON_A_HELD_SWEEP = (
    "difflib",
    "hashlib",
    "secrets",
    "socket",
    "tempfile",
    "random",
)


def test_a_held_sweep_imports_nothing_it_does_not_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hpclaunch

    _slow_slurm(tmp_path / "bin", monkeypatch, 0)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPCLAUNCH"))}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    env["PYTHONPATH"] = str(Path(hpclaunch.__file__).parent.parent)  # the tree under test
    listed = tmp_path / "modules.txt"
    probe = (
        "import atexit, sys; "
        f"atexit.register(lambda: open({str(listed)!r}, 'w').write(' '.join(sys.modules))); "
        "from hpclaunch.cli.main import main; main()"
    )
    argv = [sys.executable, "-c", probe, "sweep", "--cluster", "slurm", "--json"]
    argv += ["--run-root", str(tmp_path / "runs"), "--grid", "a=1,2", "--grid", "b=x,y"]
    argv += ["--sbatch-arg=--hold", "--no-snapshot", "--", "python3", "train.py", "{a}"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and '"sweep_id"' in done.stdout, done.stderr
    loaded = set(listed.read_text().split())
    assert "hpclaunch.sweeps.submit" in loaded
    assert [name for name in NOT_ON_A_HELD_SWEEP if name in loaded] == []


def test_params_sh_encodes_each_word_once_and_makes_no_json_encoder_per_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 1,000-point grid's params.sh hex-encoded 4,000 argument words (os.fsencode, a
    third of its lines' cost) and made a JSON encoder per point (json.dumps with
    arguments): each distinct word is encoded once, the encoder made once. The lines
    are what they were."""
    import json

    from hpclaunch.script import launchers
    from hpclaunch.sweeps import script
    from hpclaunch.sweeps.points import Point

    points = [Point(i, {"a": str(i // 10), "b": "x y"}, ("--a", str(i // 10))) for i in range(100)]
    expected = []
    for point in points:
        pairs = dict(script.point_env("S", 100, point))
        pairs["HPCLAUNCH_PARAMS"] = json.dumps(
            dict(point.params), separators=(",", ":"), ensure_ascii=False
        )
        pairs["HPCLAUNCH_POINT_ARGS"] = ",".join(os.fsencode(a).hex() for a in point.args)
        expected.append(pairs)
    launchers._hex_word.cache_clear()
    encoded: list[str] = []
    real_fsencode = os.fsencode
    monkeypatch.setattr(os, "fsencode", lambda w: encoded.append(w) or real_fsencode(w))
    made: list[int] = []
    real_init = json.JSONEncoder.__init__

    def counting(self: json.JSONEncoder, *args: Any, **kwargs: Any) -> None:
        made.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(json.JSONEncoder, "__init__", counting)
    for point, pairs in zip(points, expected):
        assert dict(script.point_env("S", 100, point)) == pairs
    assert sorted(encoded) == sorted({"--a", *(str(i) for i in range(10))})
    assert made == []
