"""`hpclaunch --remote testbed-login dev --jupyter` from the testbed's laptop (issue 36):
the relay rides on the OpenSSH master as a stdio channel (no TCP forwarding), the URL
printed works on the laptop, Ctrl-C leaves nothing, a silent laptop's session ends."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import laptop as lp
import testbed
from test_e2e_dev import (
    REPO_VENV,
    Session,
    _job_gone,
    _session_job,
    check_jupyter,
    check_nothing_left,
    entry_lines,
    vscode_host,
)
from test_e2e_remote import set_up  # noqa: F401  (the module's fixture: remote setup)

# test_e2e_remote's xdist group (tests/conftest.py's XDIST_GROUPS): one login home and
# SSH master, one test at a time.
pytestmark = pytest.mark.testbed


@pytest.fixture
def project(set_up: None) -> Iterator[lp.Laptop]:  # noqa: F811
    found = lp.new_project({"notes.txt": "x\n"})
    yield found
    shutil.rmtree(found.cwd, ignore_errors=True)


def _laptop_session(project: lp.Laptop, *args: str) -> Session:
    argv = ["/usr/bin/env", "-u", "USER", "-u", "LOGNAME", lp.HPCLAUNCH, "--remote", lp.LOGIN]
    return Session(project.cwd, project.env(), *argv, "dev", "--jupyter", *args, user=lp.USER)


def test_jupyter_from_the_laptop(project: lp.Laptop) -> None:
    if testbed.layout() != "netns":
        pytest.skip("the node's processes and sockets are told apart in the netns layout")
    session = _laptop_session(project, "--venv", str(REPO_VENV), "--env", "DEV_MARK=j-1")
    marker = "hpclaunch: Jupyter (on this machine): "
    checked = check_jupyter(session, marker, lp.login_home() / "runs")
    check_nothing_left(session, *checked)
    assert not _serving()  # the login node's side of the session is gone too


def _serving() -> list[str]:
    """The login node's hpclaunch serving a laptop's command (only the laptop tests' own,
    which run one at a time: their xdist group)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "hpclaunch.cli.serve" in args:
            found.append(f"{pid} {args}")
    return found


def test_a_silent_laptop_releases_the_allocation(project: lp.Laptop) -> None:
    name = f"devbeat-{uuid.uuid4().hex[:6]}"
    folder = lp.login_home() / ".config" / "hpclaunch" / "clusters"
    profile = folder / f"{name}.toml"
    folder.mkdir(parents=True, exist_ok=True)
    profile.write_text('kind = "slurm"\ndiscover = true\ndev_heartbeat_timeout = 8\n')
    user = pwd.getpwnam(testbed.USER)
    for path in (profile, folder, folder.parent, folder.parent.parent):
        os.chown(path, user.pw_uid, user.pw_gid)
    profile.chmod(0o600)
    session = _laptop_session(project, "--cluster", name, "--venv", str(REPO_VENV))
    try:
        session.until("hpclaunch: Jupyter (on this machine): ")
        job_id = _session_job("\n".join(session.lines))
        os.kill(session.pid, signal.SIGSTOP)  # the laptop sleeps: no frame, no ping
        # 8 s of silence, a status call's back-off, the clean-up: well within 90 s.
        assert _job_gone(job_id, timeout=90), "the allocation outlived the heartbeat timeout"
    finally:
        os.kill(session.pid, signal.SIGCONT)
        # runuser stops itself when its child stops (as su does): it goes on too.
        os.kill(session.proc.pid, signal.SIGCONT)
        profile.unlink()
    _, rest = session.proc.communicate(timeout=120)
    said = "\n".join(session.lines) + rest
    assert "the laptop was silent for" in said, said


def test_vscode_from_the_laptop_lands_in_the_image(project: lp.Laptop, user_image: Path) -> None:
    if not (user_image / "usr" / "sbin" / "sshd").exists():
        pytest.skip("the test image has no sshd yet: testbed/image.sh builds it with one")
    args = ("--container", str(user_image), "--container-runtime", "charliecloud")
    argv = ["/usr/bin/env", "-u", "USER", "-u", "LOGNAME", lp.HPCLAUNCH, "--remote", lp.LOGIN]
    session = Session(project.cwd, project.env(), *argv, "dev", "--vscode", *args, user=lp.USER)
    config = lp.home() / ".ssh" / "config"
    try:
        host = vscode_host(session, "hpclaunch: VS Code (on this machine): ")
        assert "(sshd in the run's image)" in session.lines[-1], session.lines
        assert entry_lines(config, host)
        done = project.cmd(["ssh", host, "cat", "/hpclaunch-test-image"], timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.strip() == "yes", done.stdout
    except BaseException:
        session.kill()
        raise
    assert session.interrupt() == 130, session.lines
    assert not entry_lines(config, host)
    assert _job_gone(_session_job("\n".join(session.lines)))
