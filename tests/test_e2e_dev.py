"""`hpclaunch dev` on the real two-node testbed (issue 36): a session's own allocation,
a shell on its first node inside the run's container, the allocation released after."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import testbed
from conftest import Hpc

pytestmark = pytest.mark.testbed


def _in_terminal(hpc: Hpc, command: str, typed: str, timeout: float = 300) -> str:
    """`command` under script(1), a pseudo-terminal, with `typed` as the keyboard; its
    output, the exit code checked by the caller through the returned process."""
    proc = subprocess.run(
        ["runuser", "-u", testbed.USER, "--", "script", "-qec", command, "/dev/null"],
        input=typed, cwd=hpc.cwd, env=hpc.env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    return f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def _session_job(output: str) -> str:
    """The job id of `hpclaunch: session RUN: job J`."""
    line = next(ln for ln in output.splitlines() if "hpclaunch: session " in ln)
    return line.rsplit(" ", 1)[1].strip()


def _job_gone(job_id: str) -> bool:
    done = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T"],
        env={**testbed.user_env(), "SLURM_CONF": str(testbed.conf_path())},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return not done.stdout.strip()


def test_dev_shell_runs_on_the_node_inside_the_container(hpc: Hpc, user_image: Path) -> None:
    typed = "tty; cat /hpclaunch-test-image; echo on-$SLURMD_NODENAME; exit 4\n"
    command = (
        f"hpclaunch dev --container {user_image} --container-runtime charliecloud "
        "--env DEV_MARK=dev-mark-1"
    )
    out = _in_terminal(hpc, command, typed.replace("exit 4", "echo $DEV_MARK; exit 4"))
    assert out.startswith("rc=4\n"), out
    assert "/dev/pts/" in out and "\nyes" in out, out  # a terminal, in the image
    assert "dev-mark-1" in out and "on-node1" in out, out  # the run's variables, node1
    job_id = _session_job(out)
    assert _job_gone(job_id), f"job {job_id} still in the queue"
    record = hpc.run("status", "last", "--json")
    assert '"CANCELLED"' in record.stdout or '"COMPLETED"' in record.stdout, record.stdout
