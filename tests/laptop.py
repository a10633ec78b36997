"""The testbed's laptop (testbed/login.sh): the ordinary user hpclaptop, whose PATH has
ssh, rsync and git but no Slurm command and whose environment has no SLURM_CONF, and
the login node it reaches over a real OpenSSH server (hpcuser@127.0.0.1:2222, aliases
testbed-login, testbed-noslurm, testbed-badkey in its ~/.ssh/config)."""

from __future__ import annotations

import os
import pwd
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import testbed

USER = "hpclaptop"
LOGIN = "testbed-login"
REPO = Path(__file__).resolve().parents[1]
HPCLAUNCH = str(REPO / ".venv" / "bin" / "hpclaunch")


def available() -> str | None:
    """Why the laptop cannot be used, or None."""
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no user {USER}: start the testbed with testbed/up.sh"
    if not (testbed.state_dir() / "laptop-bin").is_dir():
        return "no laptop-bin folder: start the testbed with testbed/up.sh"
    return None


def home() -> Path:
    return Path(pwd.getpwnam(USER).pw_dir)


def login_home() -> Path:
    return Path(pwd.getpwnam(testbed.USER).pw_dir)


@dataclass
class Laptop:
    cwd: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A minimal environment: no USER, no LOGNAME, no SLURM_CONF, no Slurm on PATH."""
        return {
            "HOME": str(home()),
            "PATH": str(testbed.state_dir() / "laptop-bin"),
            "LANG": "C.UTF-8",
            **(extra or {}),
        }

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return self.cmd([HPCLAUNCH, *args], env=env, timeout=timeout)

    def cmd(
        self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            # The environment through env=, never as words: a secret must be on no
            # command line, the harness's (runuser's) included. runuser sets USER and
            # LOGNAME; env -u takes them away again.
            [
                "/usr/sbin/runuser",
                "-u",
                USER,
                "--",
                "/usr/bin/env",
                "-u",
                "USER",
                "-u",
                "LOGNAME",
                *argv,
            ],
            env=self.env(env),
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def write(self, rel: str, text: str) -> Path:
        """Write a file of the laptop user's (as root, then handed over)."""
        path = self.cwd / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        user = pwd.getpwnam(USER)
        for item in (path, *path.relative_to(self.cwd).parents):
            os.chown(self.cwd / item, user.pw_uid, user.pw_gid)
        return path


def new_project(files: dict[str, str], ignore: str = "") -> Laptop:
    """A git project in the laptop user's home holding `files` (committed)."""
    folder = home() / f"proj-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    user = pwd.getpwnam(USER)
    os.chown(folder, user.pw_uid, user.pw_gid)
    laptop = Laptop(folder)
    for rel, text in {**files, **({".gitignore": ignore} if ignore else {})}.items():
        laptop.write(rel, text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], [*git, "commit", "-qm", "start"]):
        done = laptop.cmd(
            [*argv], env={"PATH": f"{testbed.state_dir() / 'laptop-bin'}:/usr/bin:/bin"}
        )
        assert done.returncode == 0, done.stderr
    return laptop


def close_master(host: str = LOGIN) -> None:
    """End the laptop's master connection (hpclaunch keeps it 10 minutes): its session
    on the login node is a process of the testbed's user, which tests that count the
    user's processes would otherwise see."""
    from hpclaunch.remote.ssh import Host, socket_name

    sock = home() / ".cache" / "hpclaunch" / "ssh" / socket_name(Host.parse(host))
    subprocess.run(
        ["/usr/sbin/runuser", "-u", USER, "--", "ssh", "-O", "exit", "-o", f"ControlPath={sock}",
         host],
        capture_output=True,
        timeout=30,
        check=False,
    )  # fmt: skip
