"""The issue's main scenario on the real testbed: examples/ddp_train.py as 2 nodes x 2
ranks, submitted with --wait by an unprivileged user (srun and torchrun launchers), in an
salloc allocation, and with --cluster local; the trained parameters agree across ranks
and with a one-process reference run over the same data."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import testbed
from conftest import REPO, Hpc
from ddp_check import assert_params_equal_reference, load_params

pytestmark = pytest.mark.testbed
EXAMPLE = str(REPO / "examples" / "ddp_train.py")
STEPS = "20"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "ref.json"
    subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), EXAMPLE, "--steps", STEPS, "--save", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def _check(
    hpc: Hpc,
    proc: subprocess.CompletedProcess[str],
    reference: Path,
    hosts: int,
    as_json: bool = False,
) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted((hpc.cwd / "out").glob("params-*.json"))
    assert len(files) == 4, (files, proc.stderr[-2000:])
    assert_params_equal_reference(files, reference)
    assert len({r["host"] for r in load_params(list(files))}) == hosts
    # Streamed output is tagged [node rank]; the loss lines come from rank 0. With --json
    # stdout holds JSON only, so the ranks' output streams to stderr.
    streamed = proc.stderr if as_json else proc.stdout
    assert "[" in streamed and " 0] " in streamed, streamed[-2000:]


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_ddp_on_two_nodes(hpc: Hpc, reference: Path, launcher: str) -> None:
    proc = hpc.run(
        "run",
        "-N",
        "2",
        "--tasks-per-node",
        "2",
        "--launcher",
        launcher,
        "--wait",
        "--",
        "python",
        EXAMPLE,
        "--steps",
        STEPS,
        "--save",
        "out/params-{rank}.json",
        timeout=400,
    )
    hosts = 2 if testbed.layout() == "netns" else 1
    _check(hpc, proc, reference, hosts)
    (entry,) = hpc.runs()
    record = json.loads((Path(entry["run_dir"]) / "run.json").read_text())
    assert record["state"] == "COMPLETED" and record["exit_code"] == 0
    if launcher == "torchrun":
        # One torchrun agent per node: the batch script's srun starts 2 tasks, not 4.
        assert "--ntasks-per-node=1" in (Path(entry["run_dir"]) / "job.sh").read_text()
        ranks = (Path(entry["run_dir"]) / "logs" / "ranks.tsv").read_text().splitlines()
        assert len(ranks) == 4


def test_ddp_local_cluster(hpc: Hpc, reference: Path) -> None:
    proc = hpc.run(
        "run",
        "--cluster",
        "local",
        "-N",
        "2",
        "--tasks-per-node",
        "2",
        "--",
        "python",
        EXAMPLE,
        "--steps",
        STEPS,
        "--save",
        "out/params-{rank}.json",
        timeout=400,
    )
    _check(hpc, proc, reference, hosts=1)


def test_run_inside_salloc_is_a_step(hpc: Hpc, reference: Path) -> None:
    proc = hpc.cmd(
        [
            "salloc",
            "-N",
            "2",
            "--ntasks-per-node=2",
            "hpclaunch",
            "run",
            "-N",
            "2",
            "--tasks-per-node",
            "2",
            "--wait",
            "--json",
            "--",
            "python",
            EXAMPLE,
            "--steps",
            STEPS,
            "--save",
            "out/params-{rank}.json",
        ],
        timeout=400,
    )
    hosts = 2 if testbed.layout() == "netns" else 1
    _check(hpc, proc, reference, hosts, as_json=True)
    lines = [json.loads(text) for text in proc.stdout.splitlines()]  # JSON only
    line = lines[0]
    assert line["step"] is True and lines[-1]["state"] == "COMPLETED"
    # salloc says which job it granted: the step ran inside that job, no new job.
    assert f"Granted job allocation {line['job_id']}" in proc.stderr


@pytest.mark.serial  # waits for an idle cluster; counts the user's processes on the nodes
def test_failing_rank_ends_job_fast(hpc: Hpc) -> None:
    import time

    prog = str(Path(__file__).parent / "programs" / "fail_rank.py")
    start = time.monotonic()
    proc = hpc.run(
        "run",
        "-N",
        "2",
        "--tasks-per-node",
        "2",
        "--wait",
        "--",
        "python",
        prog,
        "2",
        "3",
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])
    assert elapsed < 15, elapsed
    testbed.wait_idle(timeout=30)
    left = [p for p in testbed.procs_of_user_on_nodes() if "fail_rank" in p or "bootstrap" in p]
    assert left == []


def test_non_python_program_and_its_exit_code(hpc: Hpc) -> None:
    """A non-Python program runs too (bash), and its exit code comes back."""
    proc = hpc.run("run", "-N", "1", "--wait", "--", "bash", "-c", "echo hi; exit 7")
    assert proc.returncode == 7, proc.stderr
    assert "hi" in proc.stdout
