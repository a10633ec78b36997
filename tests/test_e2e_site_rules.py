"""Site rules on the testbed (issue 31, section 3): partition "site" has a job_submit Lua
filter with rules like the AI sites' (testbed/up.sh: GPUs through --gres, a QoS named, at
least 2 CPUs per GPU; tests/test_site_filter.py runs the same Lua here).

With a profile that knows the rules, hpclaunch refuses before sbatch in the profile's
words (nothing queued, no run folder); with one that does not, the site's own rejection
comes back as one line holding the site's message, exit 2, no traceback, no run folder.
A profile that knows the site's spelling (--gres) and names a QoS runs the job.

These tests NEED THE FILTER: a testbed started by an up.sh without it (no
JobSubmitPlugins=lua, no partition "site") skips them, and fails them in CI."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

import testbed
from conftest import Hpc

pytestmark = pytest.mark.testbed

SITE_RULES = """\
[[rules]]
kind = "require_qos"
partition = "site"
message = "a job on partition site must name a QoS (--qos)"
source = "testbed/up.sh job_submit.lua"

[[rules]]
kind = "min_cpus_per_gpu"
value = 2
partition = "site"
message = "at least 2 CPUs per GPU on partition site"
source = "testbed/up.sh job_submit.lua"
"""
KNOWING = 'kind = "slurm"\ndiscover = true\ndefault_partition = "site"\n' \
          '[sbatch_lines]\ngpus-per-node = "--gres=gpu:{}"\n' + SITE_RULES  # fmt: skip
NAIVE = 'kind = "slurm"\ndiscover = true\ndefault_partition = "site"\n'


@pytest.fixture
def site_filter(slurm_conf: Path) -> None:
    conf = slurm_conf.read_text()
    if "JobSubmitPlugins=lua" not in conf or "PartitionName=site" not in conf:
        reason = "needs the testbed's job_submit filter (testbed/up.sh of branch sites)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


def write_profile(hpc: Hpc, name: str, text: str) -> None:
    """The user's own ~/.config/hpclaunch/clusters/NAME.toml, theirs and private."""
    folder = Path(hpc.env["XDG_CONFIG_HOME"]) / "hpclaunch" / "clusters"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text(text)
    user = pwd.getpwnam(hpc.user)
    for path in (folder.parent, folder, folder / f"{name}.toml"):
        os.chown(path, user.pw_uid, user.pw_gid)
        path.chmod(0o700 if path.is_dir() else 0o600)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a refused command (a note may come before it), exit 2, no
    traceback."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hpclaunch: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return errors[0]


def refused(hpc: Hpc, *args: str) -> str:
    """`hpclaunch run ARGS -- true` refused: exit 2, one line, nothing queued or kept."""
    said = error_line(hpc.run("run", "-N", "2", "--gpus-per-node", "1", *args, "--", "true"))
    assert hpc.run_dirs() == [] and testbed.jobs_from(hpc.cwd) == []
    assert hpc.runs() == []  # no record half-written: the run index names nothing either
    return said


def test_a_profile_that_knows_the_rules_refuses_before_sbatch(site_filter: None, hpc: Hpc) -> None:
    write_profile(hpc, "labsite", KNOWING)
    said = refused(hpc, "--cluster", "labsite", "--cpus-per-task", "2")
    assert "--qos" in said and "labsite says: a job on partition site must name a QoS" in said
    said = refused(hpc, "--cluster", "labsite", "--qos", "normal", "--cpus-per-task", "1")
    assert "labsite says: at least 2 CPUs per GPU on partition site" in said
    assert "sbatch" not in said  # refused here, not by the site


def test_a_naive_profile_gets_the_sites_own_words_back(site_filter: None, hpc: Hpc) -> None:
    write_profile(hpc, "naive", NAIVE)
    said = refused(hpc, "--cluster", "naive", "--qos", "normal", "--cpus-per-task", "2")
    assert said.startswith("hpclaunch: error: sbatch: the site refused the job: ")
    assert "site rule: request GPUs with --gres=gpu:N on partition site" in said
    said = refused(hpc, "--cluster", "naive", "--cpus-per-task", "2")  # no QoS either
    assert "site rule: request GPUs with --gres=gpu:N" in said  # the site's first rule


def test_the_profile_that_knows_the_site_runs_its_job(site_filter: None, hpc: Hpc) -> None:
    write_profile(hpc, "labsite", KNOWING)
    proc = hpc.run(
        "run", "--cluster", "labsite", "-N", "2", "--gpus-per-node", "1", "--qos", "normal",
        "--cpus-per-task", "2", "--wait", "--", "python3", "-c",
        "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])",
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run_dir] = hpc.run_dirs()
    assert "#SBATCH --gres=gpu:1" in (run_dir / "job.sh").read_text()


def test_any_rejection_by_slurm_is_one_line_exit_2_and_leaves_nothing(hpc: Hpc) -> None:
    """Without the filter too: Slurm's own refusal at submission (a reservation that does
    not exist) comes back in its words, exit 2, no traceback, no run folder, nothing queued."""
    said = error_line(hpc.run("run", "--reservation", "nosuch", "--", "true"))
    assert said.startswith("hpclaunch: error: sbatch: the site refused the job: ")
    assert "reservation" in said.lower()
    assert hpc.run_dirs() == [] and testbed.jobs_from(hpc.cwd) == []
    assert hpc.runs() == []
