"""Bad requests: each exits 2 with one line `hpclaunch: error: <field>: ...`, no traceback,
nothing submitted, no run directory and no index entry left behind (on the testbed, as
the unprivileged user, so the partition limits are the ones sinfo reports)."""

from __future__ import annotations

import re
import subprocess

import pytest

import testbed
from conftest import Hpc

pytestmark = pytest.mark.testbed

LINE = re.compile(r"^hpclaunch: error: [^\n]+: [^\n]+\.[^\n]*\n\Z")

BAD: list[tuple[str, list[str], str]] = [
    ("zero nodes", ["-N", "0"], "--nodes"),
    ("negative nodes", ["-N", "-1"], "--nodes"),
    ("nodes not a number", ["-N", "two"], "--nodes"),
    ("more GPUs than nodes have", ["--gpus-per-node", "3"], "--gpus-per-node"),
    ("time over short's limit", ["-p", "short", "-t", "5"], "--time"),
    ("more nodes than the partition", ["-N", "3"], "--nodes"),
    ("unknown partition", ["-p", "gpu-huge"], "--partition"),
    ("unknown cluster", ["--cluster", "nosuch"], "--cluster"),
    ("malformed time", ["-t", "1:2:3:4"], "--time"),
    ("malformed memory", ["--mem", "lots"], "--mem"),
    ("memory over the node's", ["--mem", "900G"], "--mem"),
    ("newline in job name", ["-J", "a\nb"], "--job-name"),
    (
        "tasks x CPUs over cores",
        ["--tasks-per-node", "2", "--cpus-per-task", "2"],
        "--cpus-per-task",
    ),
    ("LUMI without an account", ["--cluster", "lumi", "-N", "1"], "--account"),
    ("LUMI account of the wrong shape", ["--cluster", "lumi", "-A", "myproj"], "--account"),
    ("mem and mem-per-gpu", ["--mem", "1G", "--mem-per-gpu", "1G"], "--mem"),
    ("env without =", ["--env", "FOO"], "--env"),
    ("env bad name", ["--env", "1X=2"], "--env"),
    ("unknown option", ["--frobnicate"], "--frobnicate"),
    ("bad launcher", ["--launcher", "mpirun"], "--launcher"),
    ("modelled sbatch option", ["--sbatch-arg=--nodes=3"], "--sbatch-arg"),
    ("bad experiment name", ["--exp", "../up"], "--exp"),
    ("zero time", ["-t", "0"], "--time"),
]


def _assert_user_error(proc: subprocess.CompletedProcess[str], field: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert LINE.match(proc.stderr), repr(proc.stderr)
    assert proc.stderr.startswith(f"hpclaunch: error: {field}"), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize(("case", "args", "field"), BAD, ids=[b[0] for b in BAD])
def test_bad_request_is_refused_before_submission(
    hpc: Hpc, case: str, args: list[str], field: str
) -> None:
    proc = hpc.run("run", *args, "--", "python3", "-c", "pass")
    _assert_user_error(proc, field)
    assert hpc.run_dirs() == [] and not (hpc.cwd / "runs").exists()
    assert hpc.runs() == []
    assert testbed.jobs_from(hpc.cwd) == []  # this test's jobs: others run side by side


def test_missing_program(hpc: Hpc) -> None:
    _assert_user_error(hpc.run("run", "-N", "1"), "PROGRAM")
    _assert_user_error(hpc.run("run", "-N", "1", "--"), "PROGRAM")
    assert hpc.run_dirs() == [] and hpc.runs() == []


def test_unknown_run_reference(hpc: Hpc) -> None:
    _assert_user_error(hpc.run("status", "nosuchrun"), "RUN")
    _assert_user_error(hpc.run("logs", "nosuchrun"), "RUN")
