"""The login node's side of a laptop's session (`hpclaunch --remote HOST dev --jupyter`):
the laptop's ssh carries the session's frames on this process's stdin/stdout. Each
channel the laptop opens is connected here to the session's own relay port (a relay of
relays: no TCP forwarding of sshd is needed), the session's lines and facts go to the
laptop as TEXT frames, and the laptop's frames are its heartbeat: silent for the
profile's dev_heartbeat_timeout, or gone, it ends the session."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import IO, Any, Callable, Optional

from hpclaunch.node.relay import TEXT, NodeEnd, Writer
from hpclaunch.sessions.relay import CONTROL

# The hidden flag of `dev` that the laptop adds: stdin/stdout carry frames.
FRAMES_FLAG = "--frames"


class LaptopLink:
    def __init__(
        self,
        timeout_s: float,
        stdin: Optional[IO[bytes]] = None,
        stdout_fd: Optional[int] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        # A reader of its own on fd 0, not sys.stdin: the thread below blocks in it,
        # holding its lock, and the interpreter's exit would abort on sys.stdin's lock.
        # The laptop sends no frame before this side's first (its heartbeat message),
        # so sys.stdin's buffer holds nothing past the request line.
        self.stdin = stdin if stdin is not None else os.fdopen(os.dup(0), "rb")
        self.up = Writer(sys.stdout.fileno() if stdout_fd is None else stdout_fd)
        self.end = NodeEnd(0, self.up)  # no port until the server answers: OPEN refused
        self.last = clock()
        self.thread = threading.Thread(target=self.end.serve, args=(self._readline,), daemon=True)
        self.thread.start()
        self.send({"heartbeat": timeout_s})

    def _readline(self) -> bytes:
        line = self.stdin.readline()
        self.last = self.clock()
        return line

    def send(self, obj: dict[str, Any]) -> None:
        self.end.send(CONTROL, TEXT, json.dumps(obj).encode())

    def say(self, line: str) -> None:
        self.send({"line": line})

    def ready(self, port: int, facts: dict[str, Any]) -> None:
        """The laptop's channels go to `port` (the session's relay here) from now on;
        `facts` tell the laptop what to print or write (the URL's path, the ssh entry)."""
        self.end.port = port
        self.send(facts)

    def still_up(self) -> Optional[str]:
        if not self.thread.is_alive():
            return "the laptop closed the connection"
        silent = self.clock() - self.last
        if silent > self.timeout_s:
            return f"the laptop was silent for {silent:.0f} s (dev_heartbeat_timeout)"
        return None
