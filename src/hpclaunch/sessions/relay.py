"""hpclaunch dev's relay, the near end: a port on this machine's loopback whose
connections travel as frames (hpclaunch.node.relay's codec) over a transport process's
stdin/stdout to the node's end, which connects each to the session's loopback port.

The transport is any process that carries bytes both ways: on the submitting host the
overlapping srun step running the node's end; on a laptop (--remote) `ssh` over the
OpenSSH master to the login node's session, a stdio channel that needs no TCP forwarding.
Channel 0 carries the session's own messages (TEXT: one JSON object each, the far end's
lines and facts) and PING, the laptop's heartbeat.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Callable, Optional, Union

from hpclaunch.node.relay import OPEN, PING, TEXT, Channels, Writer, read_frame

CONTROL = 0  # the channel of TEXT and PING frames


class Relay:
    """A loopback listener here, relayed through `argv`'s stdin/stdout."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        *,
        on_text: Callable[[bytes], None] = lambda payload: None,
        stderr: Union[int, IO[bytes], None] = subprocess.DEVNULL,
        port: int = 0,
        preamble: bytes = b"",
    ) -> None:
        """preamble: bytes the transport reads before the frames (a laptop's request)."""
        self.on_text = on_text
        self.last_heard = time.monotonic()
        self.proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=None if env is None else dict(env),
            start_new_session=True,  # a terminal's Ctrl-C is the session's to handle
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if preamble:
            self.proc.stdin.write(preamble)
            self.proc.stdin.flush()
        self.channels = Channels(Writer(self.proc.stdin.fileno()))
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        self.ended = threading.Event()
        self.ids = itertools.count(1)
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._read, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return  # closed
            channel = next(self.ids)
            self.channels.send(channel, OPEN)
            self.channels.add(channel, sock)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        readline = self.proc.stdout.readline
        while True:
            try:
                got = read_frame(readline)
            except (OSError, ValueError):
                got = None
            if got is None:
                break
            channel, kind, payload = got
            self.last_heard = time.monotonic()
            if not self.channels.dispatch(channel, kind, payload) and kind == TEXT:
                self.on_text(payload)
        self.channels.close_all()
        self.ended.set()

    def ping(self) -> None:
        """The heartbeat: the far end knows this end is alive."""
        self.channels.send(CONTROL, PING)

    def alive(self) -> bool:
        return not self.ended.is_set() and self.proc.poll() is None

    def close(self, grace_s: float = 5.0) -> None:
        """No listener, no connection, no transport process left."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept()
        with contextlib.suppress(OSError):
            self.listener.close()
        self.channels.close_all()
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the node's end sees its stdin end and exits
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
