"""`hpclaunch profile init NAME` on the testbed: it asks the real Slurm (scontrol show
config, sinfo with GRES and features, scontrol show partition, scontrol show node; the
testbed has no accounting, so sacctmgr does not answer) and writes the user's profile,
private; a 2-node x 1-GPU job then runs unchanged with it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from conftest import Hpc
from hpclaunch.config.profiles import load_profile

pytestmark = pytest.mark.testbed

PROGRAM = "import os; print('rank', os.environ['RANK'], 'gpus', os.environ['CUDA_VISIBLE_DEVICES'])"


def test_init_writes_the_sites_profile_and_a_2x1_gpu_job_runs_with_it(hpc: Hpc) -> None:
    proc = hpc.run("profile", "init", "mylab", "--json")
    assert proc.returncode == 0, proc.stderr
    written = Path(json.loads(proc.stdout)["file"])
    info = written.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid != 0  # the user's, private
    profile = load_profile("mylab", None, {"XDG_CONFIG_HOME": hpc.env["XDG_CONFIG_HOME"]})
    assert profile.detect_cluster_names == ("lab",)  # the testbed's ClusterName
    assert profile.default_partition == "debug" and profile.node.gpus == 2
    assert profile.partitions["short"].max_time == 60
    assert profile.unverified == ()  # cons_tres and Arch answered: nothing guessed
    assert "does not answer" in profile.sources["accounting"]
    again = hpc.run("profile", "init", "mylab")  # never over the user's file unasked
    assert again.returncode == 2 and "--force" in again.stderr

    ran = hpc.run(
        "run", "--cluster", "mylab", "-N", "2", "--gpus-per-node", "1", "--wait",
        "--", "python3", "-c", PROGRAM, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    [run_dir] = hpc.run_dirs()
    assert "#SBATCH --gpus-per-node=1" in (run_dir / "job.sh").read_text()
    out = "".join(p.read_text() for p in sorted((run_dir / "logs").glob("rank-*.out")))
    assert "rank 0 gpus" in out and "rank 1 gpus" in out, out
