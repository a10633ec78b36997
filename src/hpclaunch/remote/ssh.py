"""One multiplexed OpenSSH connection to a cluster's login node: the only seam between a
laptop and a remote hpclaunch (run a command with standard input; sync a folder).

The system `ssh` and `rsync` do all the work, so the user's ~/.ssh/config, keys, agent,
jump hosts and two-factor prompts keep working. The first call of a command starts a
master connection (`ssh -f -N -M`, ControlPersist): the prompts, if any, come then, and
every later call of this command and of the next commands for 10 minutes reuses it
(about 5 ms on a LAN instead of a new key exchange). Its socket lies in a folder only
this user can enter, named after the destination, so a liveness check is a connect() on
a Unix socket: no process is spawned for it.

Calls after the master runs use ControlMaster=no: a call that became a master itself
would keep its stderr pipe open in the background and hang whoever reads it.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, Optional

from hpclaunch.basics import shell
from hpclaunch.errors import UserError

PERSIST_S = 600  # how long an idle master waits for the next command
CONNECT_TIMEOUT_S = 15
FIELD = "--remote"
_PORT = re.compile(r"^(?P<dest>.+?):(?P<port>[0-9]{1,5})$")
_SOCKET_MAX = 100  # sun_path holds 108 bytes; ssh appends a random suffix while binding


class Host(NamedTuple):
    """An OpenSSH destination as the user wrote it: an alias, user@host, host:port."""

    name: str  # as written (messages name it so)
    dest: str  # what ssh gets
    port: Optional[str] = None

    @staticmethod
    def parse(text: str) -> Host:
        text = text.strip()
        bad = not text or text.startswith("-") or any(c.isspace() or c == "\0" for c in text)
        if bad:
            raise UserError(
                FIELD,
                f"{text!r} is not an ssh destination",
                "an alias from ~/.ssh/config, user@host or host:port",
                "Example: --remote lumi",
            )
        found = _PORT.match(text)
        if found and not found["dest"].endswith("]"):
            return Host(text, found["dest"], found["port"])
        return Host(text, text)

    @property
    def hostname(self) -> str:
        """The host part (no user, no port): what a login node's hostname may equal."""
        return self.dest.rpartition("@")[2].strip("[]")


def control_dir(environ: Mapping[str, str]) -> Path:
    """A folder only this user can enter, short enough for a socket path. The fallback
    in /tmp has a name anyone can compute: one made by another user (or a symlink there)
    is refused in one line naming it, never used nor changed."""
    home = Path(environ.get("HOME") or Path.home())
    base = Path(environ.get("XDG_RUNTIME_DIR") or home / ".cache") / "hpclaunch" / "ssh"
    if len(str(base)) > _SOCKET_MAX - 20:
        import tempfile

        base = Path(tempfile.gettempdir()) / f"hpclaunch-ssh-{os.getuid()}"
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = base.lstat()
    except OSError as exc:
        raise _not_ours(base, exc.strerror or "cannot be made") from None
    if not stat.S_ISDIR(info.st_mode):
        raise _not_ours(base, "is not a folder (a symlink or a file)")
    if info.st_uid != os.getuid():
        raise _not_ours(base, f"belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o077:
        os.chmod(base, 0o700)  # ours but too open: close it
    return base


def _not_ours(base: Path, problem: str) -> UserError:
    return UserError(
        "ssh control folder",
        f"{base} {problem}",
        "",
        "Remove it (its owner or an admin can), or set XDG_RUNTIME_DIR to a short "
        "folder of yours (e.g. export XDG_RUNTIME_DIR=~/.r)",
    )


def socket_name(host: Host) -> str:
    """The master's socket in control_dir(): one per destination and port."""
    import hashlib  # here: only a remote command needs it

    return hashlib.sha1(f"{host.dest}:{host.port}".encode()).hexdigest()[:16]


class Connection:
    """Calls to one host over one master connection."""

    def __init__(self, host: Host, environ: Mapping[str, str]) -> None:
        self.host = host
        self.environ = dict(environ)
        self.socket = control_dir(environ) / socket_name(host)

    # ---- the master ------------------------------------------------------------------
    def _options(self, master: str) -> list[str]:
        out = [
            "-o",
            f"ControlPath={self.socket}",
            "-o",
            f"ControlMaster={master}",
            "-o",
            f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o",
            "ServerAliveInterval=30",
        ]
        if master == "yes":
            out += ["-o", f"ControlPersist={PERSIST_S}"]
        if self.host.port:
            out += ["-p", self.host.port]
        return out

    def alive(self) -> bool:
        """The master answers on its socket (a stale socket file refuses)."""
        import socket  # here: only a remote command needs it

        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(self.socket))
            return True
        except OSError:
            return False
        finally:
            probe.close()

    def open(self) -> Connection:
        """Start the master unless one runs; a refusal becomes one line naming the host."""
        if self.alive():
            return self
        if self.socket.exists():
            self.socket.unlink()  # a dead master's socket: ssh would refuse to bind
        argv = ["ssh", "-f", "-N", *self._options("yes"), self.host.dest]
        import tempfile

        # stderr into a file, not a pipe: the backgrounded master would hold a pipe open.
        with tempfile.TemporaryFile() as err:
            try:
                done = subprocess.run(argv, stdin=None, stdout=err, stderr=err, check=False)
            except FileNotFoundError:
                raise UserError(
                    FIELD, "ssh is not on PATH", "", "Install OpenSSH's client"
                ) from None
            err.seek(0)
            text = err.read().decode("utf-8", "replace")
        if done.returncode != 0 or not self.alive():
            raise refused(self.host, text)
        return self

    def close(self) -> None:
        """End the master (the next command starts a new one)."""
        if self.alive():
            subprocess.run(
                ["ssh", "-O", "exit", *self._options("no"), self.host.dest],
                capture_output=True,
                check=False,
            )

    # ---- calls -------------------------------------------------------------------------
    def ssh_argv(self, remote: Sequence[str], tty: bool = False) -> list[str]:
        """ssh over the master running `remote` (quoted here: the remote shell reads it)."""
        flags = ["-t"] if tty else ["-T"]
        return ["ssh", *flags, *self._options("no"), self.host.dest, "--", shell.command(remote)]

    def ssh_command(self) -> str:
        """The transport for rsync's -e: ssh over the master, as one quoted string."""
        return shell.command(["ssh", "-T", *self._options("no")])

    def run(
        self, remote: Sequence[str], stdin: bytes = b"", timeout: Optional[float] = None
    ) -> subprocess.CompletedProcess[bytes]:
        """A call whose output is read here."""
        return subprocess.run(
            self.ssh_argv(remote),
            input=stdin,
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    def stream(self, remote: Sequence[str], stdin: bytes = b"", tty: bool = False) -> int:
        """A call whose output goes straight to this terminal; its exit code."""
        if tty:
            return subprocess.run(self.ssh_argv(remote, tty=True), check=False).returncode
        proc = subprocess.Popen(self.ssh_argv(remote), stdin=subprocess.PIPE)
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the remote ended before reading: its exit code says why
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise

    def rsync(self, args: Sequence[str], make_dir: str = "") -> subprocess.CompletedProcess[str]:
        """rsync over the master; `args` name remote paths as `:PATH`. make_dir: a remote
        folder made first (rsync makes only the last part of a destination), and closed
        to group and others: what is shipped there is private (a home is often 0755)."""
        target = [a.replace(":", f"{self.host.dest}:", 1) if a.startswith(":") else a for a in args]
        if make_dir:
            made = shell.command(["mkdir", "-p", make_dir])
            closed = shell.command(["chmod", "go-rwx", make_dir])
            target.insert(0, f"--rsync-path=umask 077 && {made} && {closed} && rsync")
        try:
            return subprocess.run(
                ["rsync", "-e", self.ssh_command(), *target],
                capture_output=True,
                text=True,
                check=False,
            )
        except FileNotFoundError:
            raise UserError(
                "rsync", "rsync is not on PATH", "", "Install rsync (apt install rsync)"
            ) from None


_REASONS = (
    (
        "Could not resolve hostname",
        "cannot find the host",
        "Check the name, or add a Host entry for it in ~/.ssh/config",
    ),
    (
        "Permission denied",
        "refused the login",
        "`ssh {host} true` must log in: add your "
        "public key to ~/.ssh/authorized_keys there, or load it with ssh-add",
    ),
    (
        "Host key verification failed",
        "its host key is unknown or changed",
        "Run `ssh {host}` once and check the key it shows",
    ),
    ("Connection refused", "refused the connection", "Check the host and port"),
    ("timed out", "did not answer", "Check the host, the port and your network (VPN?)"),
    ("No route to host", "cannot be reached", "Check the host and your network"),
)


def refused(host: Host, stderr: str) -> UserError:
    """ssh's failure as one line: what happened, ssh's own words, the fix."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = next((ln for ln in reversed(lines) if not ln.startswith("Warning:")), "ssh failed")
    for needle, problem, fix in _REASONS:
        if needle in stderr:
            return UserError(
                FIELD, f"{host.name} {problem} ({said})", "", fix.format(host=host.name)
            )
    return UserError(
        FIELD, f"cannot connect to {host.name} ({said})", "", f"Check `ssh {host.name} true`"
    )
