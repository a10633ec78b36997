"""A minimal environment (cron, CI containers): no USER and no LOGNAME. A Charliecloud
job, a staged job and a local run all succeed; the user name comes from the uid."""

from __future__ import annotations

import json

import pytest

import testbed
from conftest import Hpc

pytestmark = pytest.mark.testbed

PROBE = "import os, sys; print('user', os.environ.get('USER'), 'rank', os.environ['RANK'])"


def _bare(hpc: Hpc) -> None:
    for name in ("USER", "LOGNAME"):
        hpc.env.pop(name, None)


def test_container_job_without_user(hpc: Hpc, user_image: object) -> None:
    _bare(hpc)
    proc = hpc.run(
        "run", "-N", "2", "--tasks-per-node", "1", "--wait", "--container", str(user_image),
        "--container-runtime", "charliecloud", "--", "python3", "-c", PROBE,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count(f"user {testbed.USER} rank") == 2, proc.stdout


def test_staged_job_and_local_run_without_user(hpc: Hpc) -> None:
    _bare(hpc)
    data = hpc.folder("data")
    (data / "a.txt").write_text("staged\n")
    read = "import os; print(open(os.environ['HPCLAUNCH_DATA_DATA'] + '/a.txt').read().strip())"
    for cluster in ("slurm", "local"):
        proc = hpc.run(
            "run", "--cluster", cluster, "--tasks-per-node", "2", "--wait", "--stage", "data",
            "--", "python3", "-c", read,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert proc.stdout.count("staged") == 2, proc.stdout
    local = hpc.run("run", "--cluster", "local", "--json", "--", "python3", "-c", PROBE)
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout.splitlines()[0])["run_id"]
    assert f"user {testbed.USER} rank 0" in local.stderr  # --json: stdout holds JSON only
