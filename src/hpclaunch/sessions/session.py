"""One `hpclaunch dev` session from start to end: the allocation (its own, or a running
run's), the shell or the server and its relay, the clock, and the clean-up whatever
ends it (Ctrl-C, `hpclaunch cancel`, the time limit, the server's end): the relay and
the server stop, and a session's own allocation is released."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from hpclaunch.backends import runstatus
from hpclaunch.records.runrecord import RunRecord
from hpclaunch.sessions import allocation, clock, jupyter, servers
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
    on_ready: Callable[[int, str, str], None] = lambda port, url, token: None,
    still_up: Callable[[], Optional[str]] = lambda: None,
) -> str:
    """The server and its relay until something ends the session; why it ended."""
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
        say(f"hpclaunch: Jupyter: {url}")
        on_ready(relay.port, url, token)
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
