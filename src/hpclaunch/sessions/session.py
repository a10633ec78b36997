"""One `hpclaunch dev` session from start to end: the allocation (its own, or a running
run's), the shell or the server and its relay, the clock, and the clean-up whatever
ends it (Ctrl-C, `hpclaunch cancel`, the time limit, the server's end): the relay and
the server stop, and a session's own allocation is released."""

from __future__ import annotations

import contextlib
import shutil
import signal
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from hpclaunch.backends import runstatus
from hpclaunch.basics.users import user_name
from hpclaunch.records.runrecord import RunRecord
from hpclaunch.sessions import allocation, clock, jupyter, servers, sshconfig, sshd
from hpclaunch.sessions.relay import Relay

Say = Callable[[str], None]


@contextlib.contextmanager
def allocated(
    options: Mapping[str, Any],
    join: Optional[Path],
    cwd: Path,
    environ: Mapping[str, str],
    argv: Sequence[str],
    say: Say,
) -> Iterator[RunRecord]:
    """The running run the session lives in; its own is cancelled at the end."""
    if join is not None:
        yield runstatus.refresh_one(join)
        return
    run = allocation.start(options, cwd, environ, argv)
    try:
        say(f"hpclaunch: session {run.id}: job {run.job_id}")
        record = allocation.wait_running(run.run_dir, say)
        say(f"hpclaunch: on {allocation.node_of(record)}")
        yield record
    finally:
        allocation.end(run)


def with_jupyter(
    record: RunRecord,
    environ: Mapping[str, str],
    say: Say,
    *,
    local_port: int = 0,
    on_ready: Optional[Callable[[int, dict[str, Any]], None]] = None,
    still_up: Callable[[], Optional[str]] = lambda: None,
    for_laptop: bool = False,
) -> str:
    """The server and its relay until something ends the session; why it ended.
    on_ready: told the relay's port and the facts (--json, a laptop's link)."""
    token, port = jupyter.new_token(), servers.random_port()
    log = servers.log_file(record, "jupyter")
    server = servers.start_server(
        record, jupyter.command(port), environ, {jupyter.TOKEN_VAR: token}, log
    )
    relay: Optional[Relay] = None
    try:
        relay = servers.start_relay(record, port, environ, local_port)
        jupyter.wait_ready(relay.port, token, server, log)
        url = jupyter.url(relay.port, token)
        if not for_laptop:  # a laptop prints the URL with its own port
            say(f"hpclaunch: Jupyter: {url}")
        if on_ready is not None:
            on_ready(relay.port, {"ready": url.split(str(relay.port), 1)[1], "token": token})
        return _held(record, server, relay, say, still_up)
    finally:
        if relay is not None:
            relay.close()
        servers.stop(server)


def _held(
    record: RunRecord,
    server: Any,
    relay: Relay,
    say: Say,
    still_up: Callable[[], Optional[str]],
) -> str:
    left = clock.time_left(str(record.job_id))
    if left is not None:
        say(f"hpclaunch: {clock.left_text(left)} left; Ctrl-C ends the session")

    def ended() -> Optional[str]:
        if server.poll() is not None:
            return "the server ended"
        if not relay.alive():
            return "the relay ended"
        return still_up()

    return clock.hold(record.path, left, still_up=ended, say=say)


def with_vscode(
    record: RunRecord,
    environ: Mapping[str, str],
    say: Say,
    *,
    local_port: int = 0,
    on_ready: Optional[Callable[[int, dict[str, Any]], None]] = None,
    still_up: Callable[[], Optional[str]] = lambda: None,
    for_laptop: bool = False,
) -> str:
    """sshd and its relay until something ends the session; the `Host hpclaunch-<run>`
    entry in this user's ~/.ssh/config meanwhile (for_laptop: the laptop writes its own
    from the facts on_ready is told)."""
    keys = sshd.prepare(record, servers.random_port())
    port = int(keys.port)
    inside = sshd.image_has_sshd(record, environ)
    log = servers.log_file(record, "sshd")
    server = servers.start_server(record, sshd.command(keys), environ, {}, log, inside)
    relay: Optional[Relay] = None
    name = sshconfig.host_name(record.run_id)
    written: Optional[Path] = None
    try:
        relay = servers.start_relay(record, port, environ, local_port)
        sshd.wait_ready(relay.port, server, log)
        where = "in the run's image" if inside else "on the node"
        facts: dict[str, Any] = {"name": name, "user": user_name(environ), "where": where}
        if not for_laptop:
            known = keys.folder / "known_hosts"
            sshconfig.write_private(known, f"{name} {keys.host_public}\n")
            written = sshconfig.config_path(environ)
            user = user_name(environ)
            sshconfig.add(written, sshconfig.entry(name, user, keys.client_key, known, relay.port))
            say(f"hpclaunch: VS Code: Remote-SSH, connect to host {name} (sshd {where})")
        else:
            facts["key"] = keys.client_key.read_text(encoding="utf-8")
            facts["host_public"] = keys.host_public
        if on_ready is not None:
            on_ready(relay.port, {"ssh": facts})
        return _held(record, server, relay, say, still_up)
    finally:
        if written is not None:
            sshconfig.remove(written, name)
        if relay is not None:
            relay.close()
        servers.stop(server, first=signal.SIGUSR1)  # its keeper cleans up
        shutil.rmtree(keys.folder, ignore_errors=True)  # the session's keys go with it
