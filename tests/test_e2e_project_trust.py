"""A project file is read only when it is the user's (issue 24, item 3), as the real
users: the testbed's second user plants an hpclaunch.toml where the test user works (a
shared scratch folder, a group-writable team repository), and the test user's hpclaunch
(run with runuser) neither runs its setup lines nor takes its options, and says so.

The remote case uses the laptop user (no sbatch on PATH, so a profile's [remote] host
would be used) with an `ssh` first on its PATH that records every call: hpclaunch
starts every SSH connection through `ssh` (remote/ssh.py), so no call means nothing
was sent to the planted host. The real sshd is not needed to show that, and not used.
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

import laptop as lp
import testbed
from conftest import Hpc

pytestmark = pytest.mark.testbed

WARNING = "hpclaunch: warning: ignoring"


def _planted(marker: Path) -> str:
    return f'[run]\nexp = "planted"\nsetup = ["touch {marker}"]\n'


def _plant(other: Hpc, path: Path, text: str) -> None:
    """Write path as the second user (who may: the folder is shared)."""
    done = other.cmd(
        ["python3", "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])", str(path), text]
    )
    assert done.returncode == 0, done.stderr
    assert path.stat().st_uid == pwd.getpwnam(other.user).pw_uid


def _shared(hpc: Hpc, name: str, mode: int = 0o1777) -> Path:
    """A folder anyone may write, as /tmp or a group's scratch folder is."""
    folder = hpc.folder(name)
    folder.chmod(mode)
    return folder


def _as_victim(hpc: Hpc, cwd: Path) -> Hpc:
    return Hpc(cwd=cwd, env=hpc.env, user=hpc.user)


def _victim_folder(hpc: Hpc, path: Path) -> Path:
    done = hpc.cmd(["mkdir", "-p", str(path)])
    assert done.returncode == 0, done.stderr
    return path


def _run_locally(victim: Hpc, marker: Path) -> str:
    """A real local run and a dry-run; neither may use the planted file. stderr of both."""
    done = victim.run("run", "--cluster", "local", "--", "true")
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), "the planted setup line ran as the victim"
    assert "planted" not in str(victim.run_dirs()), victim.run_dirs()
    preview = victim.run("run", "--cluster", "local", "--dry-run", "--", "true")
    assert preview.returncode == 0, preview.stderr
    assert str(marker) not in preview.stdout and "planted" not in preview.stdout
    return done.stderr + preview.stderr


@pytest.mark.parametrize("in_git", [False, True], ids=["outside-git", "team-repository"])
def test_a_file_planted_in_a_parent_folder_is_not_used(hpc: Hpc, other: Hpc, in_git: bool) -> None:
    scratch = _shared(hpc, "scratch")
    if in_git:  # the team's repository, writable by the group (here: everyone)
        assert hpc.cmd(["git", "init", "-q", str(scratch)]).returncode == 0
    marker = scratch / "pwned"
    _plant(other, scratch / "hpclaunch.toml", _planted(marker))
    victim = _as_victim(hpc, _victim_folder(hpc, scratch / "mine"))
    err = _run_locally(victim, marker)
    planted = scratch / "hpclaunch.toml"
    if in_git:
        assert f"{WARNING} {planted}: owned by {testbed.OTHER_USER}" in err, err
    else:
        assert f"not reading {planted}: outside a git work tree" in err, err
    assert "hpclaunch: project file:" not in err


def test_a_file_of_another_user_in_the_working_folder_is_ignored(hpc: Hpc, other: Hpc) -> None:
    scratch = _shared(hpc, "scratch")
    marker = scratch / "pwned"
    _plant(other, scratch / "hpclaunch.toml", _planted(marker))
    err = _run_locally(_as_victim(hpc, scratch), marker)
    assert f"{WARNING} {scratch / 'hpclaunch.toml'}: owned by {testbed.OTHER_USER}" in err, err
    # Once warned per command: the CLI says it before the command, the run not again.
    assert err.count(WARNING) == 2, err  # the run and the dry-run


def test_a_group_writable_file_is_ignored_until_listed(hpc: Hpc) -> None:
    project = _victim_folder(hpc, hpc.cwd / "proj")
    marker = project / "pwned"
    path = project / "hpclaunch.toml"
    write = "import sys; open(sys.argv[1], 'w').write(sys.argv[2])"
    assert hpc.cmd(["python3", "-c", write, str(path), _planted(marker)]).returncode == 0
    assert hpc.cmd(["chmod", "664", str(path)]).returncode == 0
    victim = _as_victim(hpc, project)
    err = _run_locally(victim, marker)
    assert f"{WARNING} {path}: writable by its group (mode 0664)" in err, err
    # The user vouches for it in their own config: read, and the run says which file.
    config = Path(hpc.env["XDG_CONFIG_HOME"]) / "hpclaunch" / "config.toml"
    text = f'safe_project_files = ["{path}"]\n'
    assert hpc.cmd(["mkdir", "-p", str(config.parent)]).returncode == 0
    assert hpc.cmd(["python3", "-c", write, str(config), text]).returncode == 0
    assert hpc.cmd(["chmod", "600", str(config)]).returncode == 0
    preview = victim.run("run", "--cluster", "local", "--dry-run", "--", "true")
    assert preview.returncode == 0, preview.stderr
    assert f"hpclaunch: project file: {path}" in preview.stderr
    assert str(marker) in preview.stdout and WARNING not in preview.stderr
    sweep = victim.run("sweep", "--cluster", "local", "--grid", "lr=1,2", "--dry-run", "--", "true")
    assert sweep.returncode == 0, sweep.stderr
    assert f"hpclaunch: project file: {path}" in sweep.stderr


RECORDING_SSH = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/ssh-calls"
exit 255
"""


def test_a_planted_remote_host_gets_nothing(hpc: Hpc, other: Hpc) -> None:
    reason = lp.available()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    scratch = _shared(hpc, "scratch")
    scratch.parent.chmod(0o755)  # the laptop user reaches it
    _plant(
        other,
        scratch / "hpclaunch.toml",
        '[run]\ncluster = "team"\n[clusters.team]\nkind = "slurm"\n'
        '[clusters.team.remote]\nhost = "planted.invalid"\n',
    )
    bin_dir = scratch / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(RECORDING_SSH)
    (bin_dir / "ssh").chmod(0o755)
    bin_dir.chmod(0o777)
    calls = bin_dir / "ssh-calls"
    victim = lp.Laptop(scratch)
    done = victim.run("runs", env={"PATH": f"{bin_dir}:{testbed.state_dir() / 'laptop-bin'}"})
    assert not calls.exists(), calls.read_text()
    assert f"{WARNING} {scratch / 'hpclaunch.toml'}: owned by" in done.stderr, done.stderr
    shutil.rmtree(bin_dir)
