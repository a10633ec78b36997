"""--profile-ranks/--profiler and --nccl-debug on the submitting side (profiling.py):
every bad request is one line before anything is written; the variables the ranks get
(also in LUMI's script, checked against shared/LUMI.md); and local runs (`--cluster
local`, real processes through the real bootstrap) of both features. The bootstrap's
own part is tested in tests/test_bootstrap.py, the testbed's in tests/test_e2e_profile.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hpclaunch
from conftest import PROGRAMS, REPO
from hpclaunch import node
from hpclaunch.config.options import RunOptions
from hpclaunch.planning import preparing
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import render

PYSPY = REPO / ".venv" / "bin" / "py-spy"
LUMI_MD = REPO.parent / "shared" / "LUMI.md"
NO_PYSPY = pytest.mark.skipif(not PYSPY.exists(), reason="py-spy is not installed in .venv")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        **extra,
    }


def _refused(tmp_path: Path, *options: str, env: dict[str, str] | None = None) -> str:
    """`hpclaunch run --cluster local OPTIONS -- true` refused: its one stderr line."""
    proc = subprocess.run(
        [sys.executable, "-m", "hpclaunch", "run", "--cluster", "local", *options, "--", "true"],
        cwd=tmp_path,
        env=env or _env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing written
    return proc.stderr


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--profile-ranks", "0"], "--profile-ranks: '0' without --profiler."),
        (["--profiler", "nsys"], "--profiler: nsys without --profile-ranks."),
        (["--profile-ranks", "", "--profiler", "torch"], "--profile-ranks: is empty."),
        (["--profile-ranks", ",", "--profiler", "torch"], "--profile-ranks: is empty."),
        (["--profile-ranks", "0,x", "--profiler", "torch"], "'x' is not a rank number"),
        (["--profile-ranks", "-1", "--profiler", "torch"], "'-1' is not a rank number"),
        (
            ["--tasks-per-node", "2", "--profile-ranks", "0,2", "--profiler", "torch"],
            "--profile-ranks: rank 2 is not in the job (ranks 0-1 (2 ranks)).",
        ),
        (["--profile-ranks", "0", "--profiler", "vtune"], "--profiler: 'vtune' is not one of"),
    ],
)
def test_bad_profiling_requests_are_one_line(tmp_path: Path, options: list[str], says: str) -> None:
    assert says in _refused(tmp_path, *options)


def test_a_profiler_missing_here_is_refused_for_local_runs(tmp_path: Path) -> None:
    env = _env(tmp_path, PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    line = _refused(tmp_path, "--profile-ranks", "0", "--profiler", "nsys", env=env)
    assert line.startswith("hpclaunch: error: --profiler: nsys is not on PATH")


def test_pyspy_missing_here_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # stacks.pyspy_paths' rule: beside hpclaunch's Python, then on PATH; neither here.
    from hpclaunch.script import profiling

    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python3"))
    values = {"profile_ranks": "0", "profiler": "py-spy"}
    with pytest.raises(hpclaunch.UserError) as caught:
        profiling.from_values(RunOptions(**values), 1, False, {"PATH": str(tmp_path)})
    assert str(caught.value).startswith("--profiler: py-spy is not installed here")


def test_api_keywords_and_toml_keys(tmp_path: Path) -> None:
    (tmp_path / "hpclaunch.toml").write_text(
        '[run]\nprofile-ranks = "0"\nprofiler = "torch"\n', encoding="utf-8"
    )
    prepared = preparing.prepare_spec({"cluster": "local"}, ("true",), tmp_path, _env(tmp_path))
    assert prepared.spec.profiling is not None
    assert prepared.spec.profiling.ranks == (0,) and prepared.spec.profiling.tool == "torch"
    with pytest.raises(hpclaunch.UserError) as caught:
        hpclaunch.run(["true"], cluster="local", profile_ranks="3", profiler="torch", cwd=tmp_path)
    assert str(caught.value).startswith("--profile-ranks: rank 3 is not in the job")


def _lumi_env(extra: dict[str, object]) -> dict[str, str]:
    cli: dict[str, object] = {
        "cluster": "lumi",
        "nodes": "2",
        "partition": "standard-g",
        "account": "project_465000000",
        "time": "1:00:00",
        **extra,
    }
    environ = {"USER": "alice", "HOME": "/users/alice", "PATH": "/usr/bin:/bin"}
    if extra.get("profiler") == "py-spy":
        environ["PATH"] = f"{PYSPY.parent}:/usr/bin:/bin"
    cwd = Path("/project/project_465000000/alice/llm")
    resolved = preparing.prepare_spec(cli, ("python", "train.py"), cwd, environ)
    run_dir = Path("/scratch/p/alice/hpclaunch/default/RUN")
    paths = RunPaths(run_id="RUN", run_dir=run_dir, checkpoint_dir=run_dir / "checkpoints")
    plan = render.plan_batch(resolved.spec, resolved.profile, paths, cwd)
    # The exported values as bash reads them (simple words are written unquoted).
    return {k: v[1:-1] if v[:1] == '"' else v for k, v in _exports(plan.script)}


def _exports(script: str) -> list[tuple[str, str]]:
    out = []
    for line in script.splitlines():
        if line.startswith("export ") and "=" in line:
            name, _, value = line[len("export ") :].partition("=")
            out.append((name, value))
    return out


def test_lumi_nccl_debug_collects_per_rank_files_as_lumi_md_says() -> None:
    # LUMI.md: "NCCL_DEBUG_FILE=/tmp/<user>-rccl-rank<rank>.txt": one file per rank on
    # node-local /tmp (here: in the job's private folder there, which nobody else can
    # plant in); NCCL names it by host and pid, the bootstrap then by rank.
    assert "NCCL_DEBUG_FILE" in LUMI_MD.read_text(encoding="utf-8")
    plain = _lumi_env({})
    assert node.HPCLAUNCH_NCCL_COLLECT not in plain and "NCCL_DEBUG_FILE" not in plain
    debug = _lumi_env({"nccl_debug": True})
    assert debug["NCCL_DEBUG_FILE"].startswith("${HPCLAUNCH_LOCAL}/rccl-")
    assert "%h" in debug["NCCL_DEBUG_FILE"] and "%p" in debug["NCCL_DEBUG_FILE"]
    assert debug[node.HPCLAUNCH_NCCL_COLLECT] == "1"


@NO_PYSPY
def test_lumi_profiling_variables() -> None:
    env = _lumi_env({"profile_ranks": "0,14", "profiler": "py-spy"})
    assert env[node.HPCLAUNCH_PROFILER] == "py-spy"
    assert env[node.HPCLAUNCH_PROFILE_RANKS] == "0,14"
    assert env[node.HPCLAUNCH_PROFILE_DIR] == "/scratch/p/alice/hpclaunch/default/RUN/profiles"
    assert env[node.HPCLAUNCH_PYSPY] == "/scratch/p/alice/hpclaunch/default/RUN/py-spy"
    with pytest.raises(hpclaunch.UserError) as refused:
        _lumi_env({"profile_ranks": "16", "profiler": "rocprof"})
    assert "rank 16 is not in the job (ranks 0-15 (16 ranks))" in str(refused.value)


# --- local runs ------------------------------------------------------------------------


def _local(tmp_path: Path, program: list[str], **options: Any) -> tuple[int, Path]:
    shutil.copy(PROGRAMS / Path(program[1]).name, tmp_path / Path(program[1]).name)
    # This venv's Python: the one with torch (nccl_debug_writer's gloo all_reduce).
    program = [sys.executable, *program[1:]]
    run = hpclaunch.run(program, cluster="local", cwd=tmp_path, environ=_env(tmp_path), **options)
    return run.wait(timeout=240), run.run_dir


@NO_PYSPY
def test_local_pyspy_profiles_only_the_chosen_rank(tmp_path: Path) -> None:
    code, run_dir = _local(
        tmp_path,
        ["python3", "profiled_work.py", "2", "7"],
        tasks_per_node=2,
        profile_ranks="1",
        profiler="py-spy",
    )
    assert code == 7  # the program's exit code, unchanged by the profiler
    assert (run_dir / node.PYSPY).exists()
    found = sorted(p.name for p in (run_dir / "profiles").iterdir())
    assert found == ["rank-1.speedscope.json"], found
    profile = json.loads((run_dir / "profiles" / found[0]).read_text())
    assert "profiled_hot_loop" in {f["name"] for f in profile["shared"]["frames"]}
    assert "profile 1" in (run_dir / "logs" / "rank-1.out").read_text()
    assert "profile 0" in (run_dir / "logs" / "rank-0.out").read_text()


@pytest.mark.serial  # compares every NCCL debug file in /tmp before and after
def test_local_nccl_debug_files_land_in_the_logs(tmp_path: Path) -> None:
    user = os.environ.get("USER", "")
    before = set(Path("/tmp").glob(f"{user}-nccl-*"))
    code, run_dir = _local(
        tmp_path,
        ["python3", "nccl_debug_writer.py"],
        tasks_per_node=2,
        nccl_debug=True,
        env=["FAIL_RANK=1", "FAIL_CODE=3"],
    )
    assert code == 3
    folder = run_dir / "logs" / "nccl"
    assert sorted(p.name for p in folder.iterdir()) == ["rank-0.txt", "rank-1.txt"]
    assert "rank 1 stand-in" in (folder / "rank-1.txt").read_text()
    assert set(Path("/tmp").glob(f"{user}-nccl-*")) == before  # nothing left behind
