"""The plain Slurm flags (registry rows of kind "slurm") reach the testbed's real Slurm:
--nodelist node2 runs on node2 (through the API keyword), --exclude node1 runs on node2
(the CLI flag), --qos normal from hpclaunch.toml [run] is accepted, and --constraint /
--reservation that the testbed lacks are refused by sbatch itself, its reason shown.
A profile's [sbatch_lines] gpus-per-node = "--gres=gpu:{}" is a job Slurm runs on the
testbed's GRES GPUs. Unit side: tests/test_slurm_flags.py."""

from __future__ import annotations

import json

import pytest

from conftest import Hpc

pytestmark = pytest.mark.testbed

WHERE = "import os; print('on=' + os.environ['SLURMD_NODENAME'])"


def test_nodelist_through_the_api_runs_on_that_node(hpc: Hpc) -> None:
    script = (
        "import json, hpclaunch\n"
        f"run = hpclaunch.run(['python3', '-c', {WHERE!r}], cluster='slurm', nodelist='node2')\n"
        "code = run.wait(timeout=240)\n"
        "print(json.dumps({'code': code, 'logs': run.logs(rank=0)}))\n"
    )
    proc = hpc.cmd(["python3", "-c", script], timeout=300)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["code"] == 0 and "on=node2" in seen["logs"], seen
    [run_dir] = hpc.run_dirs()
    assert "#SBATCH --nodelist=node2\n" in (run_dir / "job.sh").read_text()


def test_exclude_on_the_command_line_runs_on_the_other_node(hpc: Hpc) -> None:
    proc = hpc.run("run", "--exclude", "node1", "--wait", "--", "python3", "-c", WHERE,
                   timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "on=node2" in proc.stdout and "on=node1" not in proc.stdout


def test_qos_from_the_project_file_is_accepted(hpc: Hpc) -> None:
    (hpc.cwd / "hpclaunch.toml").write_text('[run]\nqos = "normal"\n')
    proc = hpc.run("run", "--wait", "--", "true", timeout=300)
    assert proc.returncode == 0, proc.stderr
    [run_dir] = hpc.run_dirs()
    assert "#SBATCH --qos=normal\n" in (run_dir / "job.sh").read_text()


@pytest.mark.parametrize(
    ("flag", "reason"),
    [
        ("--constraint=nosuchfeature", "Invalid feature specification"),
        ("--reservation=nosuchreservation", "Requested reservation is invalid"),
    ],
)
def test_what_the_testbed_lacks_is_refused_by_slurm(hpc: Hpc, flag: str, reason: str) -> None:
    proc = hpc.run("run", flag, "--", "true", timeout=120)
    assert proc.returncode != 0
    assert reason in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_profile_spelling_of_the_gpu_line_runs(hpc: Hpc) -> None:
    """The testbed's nodes have Gres=gpu:2 (testbed/slurm.conf): --gres=gpu:1 is a
    request Slurm grants, as --gpus-per-node=1 is."""
    (hpc.cwd / "hpclaunch.toml").write_text(
        '[clusters.slurm.sbatch_lines]\n"gpus-per-node" = "--gres=gpu:{}"\n'
    )
    proc = hpc.run("run", "--gpus-per-node", "1", "--no-watch", "--wait", "--", "true",
                   timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [run_dir] = hpc.run_dirs()
    script = (run_dir / "job.sh").read_text()
    assert "#SBATCH --gres=gpu:1\n" in script and "--gpus-per-node" not in script
