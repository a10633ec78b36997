"""The `Host hpclaunch-<run>` entry of a --vscode session in the user's ~/.ssh/config
(the laptop's with --remote), and its files: the session's private key and the sshd's
host key as known_hosts. VS Code's Remote-SSH connects to that host name; its
ProxyCommand carries ssh through the session's relay port (node/relay.py --pipe).

The entry goes first in the file, between marker lines: ssh takes the first value it
finds for an option, so a `Host *` block below cannot change it; the session removes
exactly these lines at its end. The file keeps its mode (0600 when made here)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from hpclaunch import node
from hpclaunch.basics import shell


def host_name(run_id: str) -> str:
    return f"hpclaunch-{run_id}"


def config_path(environ: Mapping[str, str]) -> Path:
    home = Path(environ.get("HOME") or Path.home())
    return home / ".ssh" / "config"


def markers(name: str) -> tuple[str, str]:
    return f"# {name}: hpclaunch dev (removed when the session ends)", f"# {name}: end"


def entry(name: str, user: str, key: Path, known_hosts: Path, relay_port: int) -> str:
    proxy = [sys.executable, *node.PYTHON_FLAGS, str(node.path(node.RELAY)), "--pipe"]
    begin, end = markers(name)
    lines = [
        begin,
        f"Host {name}",
        "    HostName 127.0.0.1",
        f"    User {user}",
        f"    IdentityFile {shell.quote(str(key))}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {shell.quote(str(known_hosts))}",
        "    StrictHostKeyChecking yes",
        f"    HostKeyAlias {name}",
        f"    ProxyCommand {shell.command([*proxy, str(relay_port)])}",
        end,
    ]
    return "\n".join(lines) + "\n"


def add(path: Path, text: str) -> None:
    """`text` first in the file (made 0600 in a 0700 ~/.ssh when missing)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    mode = (path.stat().st_mode & 0o777) if path.exists() else 0o600
    _write(path, text + old, mode)


def remove(path: Path, name: str) -> None:
    """The entry's lines out of the file, whatever else changed meanwhile."""
    with contextlib.suppress(FileNotFoundError):
        begin, end = markers(name)
        kept: list[str] = []
        inside = False
        for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
            if line.rstrip("\n") == begin:
                inside = True
            elif inside and line.rstrip("\n") == end:
                inside = False
            elif not inside:
                kept.append(line)
        _write(path, "".join(kept), path.stat().st_mode & 0o777)


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.hpclaunch.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_private(path: Path, text: str) -> None:
    """A key or known_hosts file: 0600 in a 0700 folder."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
