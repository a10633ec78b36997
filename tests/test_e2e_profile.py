"""--profile-ranks/--profiler py-spy and --nccl-debug on the testbed: 2 nodes x 2 tasks.

py-spy: only rank 1 runs under it (the shipped static binary, from the run folder), on
the nodes and inside a Charliecloud image; its speedscope profile names the program's
`profiled_hot_loop`; the program's exit code comes back unchanged.

--nccl-debug: a gloo job writes nothing to NCCL_DEBUG_FILE, so the program
(tests/programs/nccl_debug_writer.py) writes that file itself after a real gloo
all_reduce, naming it as NCCL does (%h host, %p pid) on the node's private /tmp. After
success and after a failure, <run>/logs/nccl/ holds one file per rank and no node's /tmp
keeps one. (The time limit's SIGTERM to every process of a task is covered without
Slurm in tests/test_bootstrap.py.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import PROGRAMS, REPO, Hpc
from hpclaunch import node

pytestmark = pytest.mark.testbed


def _run(hpc: Hpc, program: str, *options: str, args: tuple[str, ...] = ()) -> dict[str, Any]:
    """`hpclaunch run -N 2 --tasks-per-node 2 --wait OPTIONS -- python3 PROGRAM ARGS`:
    its exit code and run folder."""
    shutil.copy(PROGRAMS / program, hpc.cwd / program)
    proc = hpc.run(
        "run", "-N", "2", "--tasks-per-node", "2", "--wait", "--json", *options,
        "--", "python3", program, *args,
        timeout=300,
    )  # fmt: skip
    [run_dir] = hpc.run_dirs()
    return {"code": proc.returncode, "run_dir": run_dir, "output": proc.stdout + proc.stderr}


def _check_pyspy(done: dict[str, Any], where: str) -> None:
    run_dir: Path = done["run_dir"]
    assert done["code"] == 7, done["output"]  # the program's own exit code
    profiles = sorted(p.name for p in (run_dir / "profiles").iterdir())
    assert profiles == ["rank-1.speedscope.json"], profiles  # rank 1 only
    profile = json.loads((run_dir / "profiles" / profiles[0]).read_text())
    names = {frame["name"] for frame in profile["shared"]["frames"]}
    assert "profiled_hot_loop" in names, sorted(names)
    logs = run_dir / "logs"
    for rank in range(4):
        out = (logs / f"rank-{rank}.out").read_text()
        assert f"rank {rank} profile {1 if rank == 1 else 0}" in out, out
        assert f"{where}\n" in out, out
        assert "hpclaunch-bootstrap" not in (logs / f"rank-{rank}.err").read_text()


@pytest.fixture(autouse=True)
def _pyspy() -> None:
    if not (REPO / ".venv" / "bin" / "py-spy").exists():
        pytest.skip("py-spy is not installed in .venv: pip install -e '.[test]'")


def test_pyspy_profiles_rank_1_only(hpc: Hpc) -> None:
    done = _run(
        hpc, "profiled_work.py", "--profile-ranks", "1", "--profiler", "py-spy", args=("3", "7")
    )
    _check_pyspy(done, "host")


def test_pyspy_profiles_rank_1_inside_charliecloud(hpc: Hpc, user_image: Path) -> None:
    done = _run(
        hpc,
        "profiled_work.py",
        "--profile-ranks", "1", "--profiler", "py-spy",
        "--container", str(user_image), "--container-runtime", "charliecloud",
        args=("3", "7"),
    )  # fmt: skip
    _check_pyspy(done, "image")


def _node_tmp_leftovers(hpc: Hpc, job_id: str) -> str:
    """What the nodes' own /tmp holds of the job's node-local folders, where the NCCL
    files are (one task per node): the bootstrap that made one removes it at the end."""
    proc = hpc.cmd(
        ["srun", "-N", "2", "--ntasks-per-node=1", "bash", "-c",
         f'shopt -s nullglob; echo "$(hostname): " /tmp/hpclaunch-{job_id}.*'],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("fail", [False, True], ids=["success", "failure"])
def test_nccl_debug_files_are_collected_per_rank(hpc: Hpc, fail: bool) -> None:
    env = ["--env", "FAIL_RANK=1", "--env", "FAIL_CODE=3", "--env", "FAIL_AFTER=2"]
    done = _run(hpc, "nccl_debug_writer.py", "--nccl-debug", *(env if fail else []))
    assert done["code"] == (3 if fail else 0), done["output"]
    folder = done["run_dir"] / "logs" / "nccl"
    files = sorted(p.name for p in folder.iterdir())
    assert files == [f"rank-{r}.txt" for r in range(4)], files
    for rank in range(4):
        text = (folder / f"rank-{rank}.txt").read_text()
        assert f"NCCL INFO rank {rank} stand-in" in text, text
        assert text.startswith("node1:" if rank < 2 else "node2:"), text
    job_id = json.loads((done["run_dir"] / "run.json").read_text())["job_id"]
    leftovers = _node_tmp_leftovers(hpc, job_id)
    assert node.LOCAL_RECORDS not in {p.name for p in done["run_dir"].iterdir()} or not any(
        (done["run_dir"] / node.LOCAL_RECORDS).iterdir()
    )  # the records went with the folders
    assert sorted(leftovers.split()) == ["node1:", "node2:"], leftovers
