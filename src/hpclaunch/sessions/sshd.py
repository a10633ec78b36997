"""hpclaunch dev --vscode: the user's own OpenSSH server in the allocation, on the
node's loopback, a random port, this session's keys only; inside the image when the
image has /usr/sbin/sshd (then VS Code's server and terminals run in the image), else
on the node. Its logins get the step's environment back (node/dev_sshd.py).

Keys are made here with ssh-keygen into <run>/dev-ssh/ (0700): the sshd's host key
and the session's client key, whose public half is the only authorized key. StrictModes
is off: the run folder may lie under a world-writable parent (/var/tmp, a scratch
root), which sshd's check refuses, while the folder itself is the user's, 0700."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpclaunch import node
from hpclaunch.errors import UserError
from hpclaunch.observe import attach
from hpclaunch.records.runrecord import RunRecord
from hpclaunch.sessions.shell import has_container

FOLDER = "dev-ssh"
SSHD = "/usr/sbin/sshd"  # sshd must be started by its absolute path
READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Keys:
    folder: Path
    port: int  # the sshd's, on the node's loopback
    client_key: Path  # the session's private key (the client side's)
    host_public: str  # the sshd's host key, one line: `TYPE BASE64`


def keygen(path: Path, comment: str) -> None:
    try:
        done = subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except FileNotFoundError:
        raise UserError(
            "--vscode", "ssh-keygen is not on PATH", "", "Install OpenSSH's client"
        ) from None
    if done.returncode != 0:
        raise UserError("--vscode", f"ssh-keygen failed: {done.stderr.strip()}", "", "")


def prepare(record: RunRecord, port: int) -> Keys:
    """The folder: keys, authorized_keys, sshd_config, the environment keeper."""
    folder = record.path / FOLDER
    folder.mkdir(mode=0o700)
    keygen(folder / "host", "hpclaunch-dev-host")
    keygen(folder / "id", f"hpclaunch-dev-{record.run_id}")
    shutil.copyfile(folder / "id.pub", folder / "authorized_keys")
    shutil.copyfile(node.path(node.DEV_SSHD), folder / node.DEV_SSHD)
    (folder / "sshd_config").write_text(config_text(folder, port), encoding="utf-8")
    host_public = " ".join((folder / "host.pub").read_text(encoding="utf-8").split()[:2])
    return Keys(folder, port, folder / "id", host_public)


def config_text(folder: Path, port: int) -> str:
    return "\n".join(
        [
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {folder / 'host'}",
            f"AuthorizedKeysFile {folder / 'authorized_keys'}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PidFile none",
            "AllowTcpForwarding yes",  # VS Code's server is reached through the login
            "X11Forwarding no",
            # ForceCommand: given by dev_sshd.py save on sshd's command line (its file)
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def command(keys: Keys) -> list[str]:
    folder = keys.folder
    keeper = ["python3", *node.PYTHON_FLAGS, str(folder / node.DEV_SSHD), "save"]
    return [*keeper, "--", SSHD, "-D", "-e", "-f", str(folder / "sshd_config")]


def image_has_sshd(record: RunRecord, environ: Mapping[str, str]) -> bool:
    """One short step in the image: `test -x /usr/sbin/sshd`."""
    if not has_container(record):
        return False
    target = attach.find_target(record, None)
    plan = attach.plan_attach(
        record, target, ["test", "-x", SSHD], container=True, pty=False, environ=environ
    )
    code, _, _ = attach.call(plan, capture=True)
    return code == 0


def wait_ready(local_port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    """Until the relay's port answers with sshd's banner."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", local_port), timeout=10) as sock:
                sock.settimeout(10)
                if sock.recv(8).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        if server.poll() is not None:
            said = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
            raise UserError("--vscode", f"sshd ended: {' '.join(said)}", "", f"See {log}")
        time.sleep(0.5)
    raise UserError("--vscode", "sshd did not answer", f"{READY_TIMEOUT_S:.0f} s", f"See {log}")
