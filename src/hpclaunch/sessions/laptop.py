"""The laptop's side of `hpclaunch --remote HOST dev --jupyter`: the login node's
hpclaunch runs the session (`dev ... --frames`) with its request as the first line of
ssh's stdin (the secrets the command names cross there, never on a command line), then
ssh's stdin/stdout carry the relay's frames over the OpenSSH master: a stdio channel,
which works where the login node forbids TCP forwarding. A port on the laptop's
loopback is relayed to the session; the URL printed names it. The laptop's frames and
PINGs are the session's heartbeat."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from hpclaunch.remote import forward
from hpclaunch.remote.ssh import Connection, Host
from hpclaunch.sessions import sshconfig
from hpclaunch.sessions.bridge import FRAMES_FLAG
from hpclaunch.sessions.relay import Relay

PING_EVERY_MAX_S = 30.0


def take_port(words: Sequence[str]) -> tuple[list[str], int]:
    """--port N is the laptop's: taken out of the words the login node gets."""
    out: list[str] = []
    port = 0
    items = list(words)
    i = 0
    while i < len(items):
        word = items[i]
        if word == "--":
            out += items[i:]
            break
        if word == "--port" and i + 1 < len(items) and items[i + 1].isdigit():
            port, i = int(items[i + 1]), i + 2
            continue
        if word.startswith("--port=") and word[7:].isdigit():
            port, i = int(word[7:]), i + 1
            continue
        out.append(word)
        i += 1
    return out, port


class View:
    """What the login node's session says, printed on the laptop with its own port."""

    def __init__(self, environ: Optional[Mapping[str, str]] = None) -> None:
        self.environ = dict(environ or {})
        self.entry: Optional[tuple[Path, str]] = None  # (~/.ssh/config, host name) written
        self.port = 0
        # No frame before the login node's first (its heartbeat): its reader starts then.
        self.ping_every: Optional[float] = None

    def text(self, payload: bytes) -> None:
        try:
            said: dict[str, Any] = json.loads(payload.decode("utf-8"))
        except ValueError:
            return
        if "heartbeat" in said:
            self.ping_every = max(0.5, min(PING_EVERY_MAX_S, float(said["heartbeat"]) / 3))
        if "line" in said:
            print(str(said["line"]), file=sys.stderr, flush=True)
        if "ready" in said:
            url = f"http://127.0.0.1:{self.port}{said['ready']}"
            print(f"hpclaunch: Jupyter (on this machine): {url}", file=sys.stderr, flush=True)
        if isinstance(said.get("ssh"), dict):
            self.ssh_entry(said["ssh"])

    def ssh_entry(self, facts: Mapping[str, Any]) -> None:
        """The session's key and host key in a private folder of the laptop, and the
        `Host hpclaunch-<run>` entry through this laptop's relay port."""
        name = str(facts["name"])
        if not name.startswith("hpclaunch-") or "/" in name or any(c.isspace() for c in name):
            return  # not a name this side would write
        home = Path(self.environ.get("HOME") or Path.home())
        folder = home / ".cache" / "hpclaunch" / "dev" / name
        sshconfig.write_private(folder / "id", str(facts["key"]))
        known = folder / "known_hosts"
        sshconfig.write_private(known, f"{name} {facts['host_public']}\n")
        config = sshconfig.config_path(self.environ)
        user = str(facts["user"])
        sshconfig.add(config, sshconfig.entry(name, user, folder / "id", known, self.port))
        self.entry = (config, name)
        where = facts.get("where", "")
        print(
            f"hpclaunch: VS Code (on this machine): Remote-SSH, connect to host {name} "
            f"(sshd {where})",
            file=sys.stderr,
            flush=True,
        )

    def clean_up(self) -> None:
        if self.entry is not None:
            config, name = self.entry
            sshconfig.remove(config, name)
            shutil.rmtree(config.parent.parent / ".cache" / "hpclaunch" / "dev" / name, True)
            self.entry = None


def remote_session(host: str, argv: Sequence[str], cwd: Path, environ: Mapping[str, str]) -> int:
    words, laptop = forward.split_laptop_options(argv)
    words, local_port = take_port(words)
    names = forward.used_names(words, (*laptop.forward_env, *forward.config_forward_env(environ)))
    conn = Connection(Host.parse(host), environ).open()
    sent = {
        **forward.sent_environment(environ, names),
        **forward.project_mirror(cwd, laptop.ship, environ),
    }
    first = json.dumps(forward.request(conn, [*words, FRAMES_FLAG], env=sent)).encode() + b"\n"
    view = View(environ)
    relay = Relay(
        conn.ssh_argv(list(forward.SERVE)),
        on_text=view.text,
        stderr=None,  # the login node's one-line errors reach this terminal as they are
        port=local_port,
        preamble=first,
    )
    view.port = relay.port
    try:
        next_ping = time.monotonic()
        while relay.alive():
            if view.ping_every is not None and time.monotonic() >= next_ping:
                relay.ping()
                next_ping = time.monotonic() + view.ping_every
            time.sleep(0.2)
        relay.ended.wait(10)  # ssh ended: its last frames (why the session ended) first
    finally:
        # The login node's session sees its stdin end and cleans up; wait for it.
        relay.close(grace_s=90)
        view.clean_up()
    code = relay.proc.returncode
    return forward.not_set_up(conn) if code == forward.NOT_SET_UP else (code or 0)
