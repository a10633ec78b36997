"""hpclaunch dev's relay, the node's end: TCP connections to one loopback port of the
node, carried as frames over this process's stdin/stdout (an overlapping srun step's),
so that nothing of a session listens on the cluster's network.

Usage: python3 -I -S -c TEXT PORT (its text is handed over like stack_probe's).

A frame is a 9-byte header, the channel (u32), its kind (u8) and the payload's length
(u32), then the payload, sent as one line of base64: slurmstepd passes a task's stdout
on line by line (a binary frame without a newline waited there; tried on the testbed's
Slurm 22.05), and with `srun -u` a 1 MB binary stream did not come through at all.

The far end opens a channel (OPEN), sends its bytes (DATA) and
closes it (CLOSE); this end connects a new socket to 127.0.0.1:PORT per channel and
sends the socket's bytes back the same way; a socket that ends or fails sends CLOSE.
PING is answered with PING (the far end knows the node is alive). Its stdin's end ends
every connection and this process. Standard library only, Python >= 3.8; the host's
side (hpclaunch.sessions.relay) imports the frame codec from here: one definition.
"""

import base64
import binascii
import contextlib
import os
import socket
import struct
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

ReadLine = Callable[[], bytes]
Frame = Tuple[int, int, bytes]

HEADER = struct.Struct(">IBI")
DATA, OPEN, CLOSE, PING, TEXT = 0, 1, 2, 3, 4
CHUNK = 49152  # 64 KiB lines of base64
CONNECT_TIMEOUT_S = 10.0


def frame(channel: int, kind: int, payload: bytes = b"") -> bytes:
    return base64.b64encode(HEADER.pack(channel, kind, len(payload)) + payload) + b"\n"


def read_frame(readline: ReadLine) -> Optional[Frame]:
    """(channel, kind, payload) of the next line, or None at the end of the stream (or
    a damaged line: the stream cannot be trusted after it)."""
    line = readline()
    if not line.endswith(b"\n"):
        return None
    try:
        data = base64.b64decode(line, validate=False)
    except (binascii.Error, ValueError):
        return None
    if len(data) < HEADER.size:
        return None
    channel, kind, length = HEADER.unpack_from(data)
    payload = data[HEADER.size :]
    return (channel, kind, payload) if len(payload) == length else None


class Writer:
    """Whole frames onto one file descriptor from many threads."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()

    def send(self, channel: int, kind: int, payload: bytes = b"") -> None:
        data = memoryview(frame(channel, kind, payload))
        with self.lock:
            while data:
                data = data[os.write(self.fd, data) :]


class Channels:
    """Sockets, one per channel, and the frames they make on a Writer. CLOSE ends one
    direction (a half-close: shutdown of the socket's writing side); a channel goes
    once both directions ended, or at once on an error."""

    def __init__(self, writer: Writer) -> None:
        self.writer = writer
        # channel -> [socket, sent CLOSE, got CLOSE]
        self.sockets: Dict[int, List[Any]] = {}
        self.lock = threading.Lock()

    def add(self, channel: int, sock: socket.socket) -> None:
        with self.lock:
            self.sockets[channel] = [sock, False, False]
        threading.Thread(target=self.pump, args=(channel, sock), daemon=True).start()

    def pump(self, channel: int, sock: socket.socket) -> None:
        """The socket's bytes to the far end, then CLOSE."""
        try:
            while True:
                data = sock.recv(CHUNK)
                if not data:
                    break
                self.writer.send(channel, DATA, data)
        except OSError:
            self.fail(channel)
            return
        self.half(channel, 1)
        self.send(channel, CLOSE)

    def half(self, channel: int, which: int) -> None:
        """One direction ended (1: this end's reading, 2: the far end's); both: gone."""
        with self.lock:
            entry = self.sockets.get(channel)
            if entry is None:
                return
            entry[which] = True
            both = entry[1] and entry[2]
        if which == 2:
            with contextlib.suppress(OSError):
                entry[0].shutdown(socket.SHUT_WR)
        if both:
            self.drop(channel)

    def fail(self, channel: int) -> None:
        if self.drop(channel) is not None:
            self.send(channel, CLOSE)

    def send(self, channel: int, kind: int, payload: bytes = b"") -> None:
        # An error: the transport is gone, and its reader ends everything.
        with contextlib.suppress(OSError):
            self.writer.send(channel, kind, payload)

    def drop(self, channel: int) -> Optional[socket.socket]:
        with self.lock:
            entry = self.sockets.pop(channel, None)
        if entry is None:
            return None
        sock: socket.socket = entry[0]
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        return sock

    def deliver(self, channel: int, payload: bytes) -> None:
        with self.lock:
            entry = self.sockets.get(channel)
        if entry is None:
            return
        try:
            entry[0].sendall(payload)
        except OSError:
            self.fail(channel)

    def dispatch(self, channel: int, kind: int, payload: bytes) -> bool:
        """A frame from the far end; False for a kind this end must handle itself."""
        if kind == DATA:
            self.deliver(channel, payload)
        elif kind == CLOSE:
            self.half(channel, 2)
        else:
            return False
        return True

    def close_all(self) -> None:
        for channel in list(self.sockets):
            self.drop(channel)


class NodeEnd(Channels):
    """The node's channels: a socket each, to 127.0.0.1:port."""

    def __init__(self, port: int, writer: Writer) -> None:
        Channels.__init__(self, writer)
        self.port = port

    def open(self, channel: int) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), CONNECT_TIMEOUT_S)
            sock.settimeout(None)
        except OSError:
            self.send(channel, CLOSE)  # nothing listens (yet): the far end may retry
            return
        self.add(channel, sock)

    def serve(self, readline: ReadLine) -> None:
        while True:
            got = read_frame(readline)
            if got is None:
                break
            channel, kind, payload = got
            if self.dispatch(channel, kind, payload):
                continue
            if kind == OPEN:
                self.open(channel)
            elif kind == PING:
                self.send(channel, PING, payload)
        self.close_all()


def pipe(port: int) -> int:
    """--pipe PORT: this process's stdin/stdout to one connection to 127.0.0.1:PORT (an
    ssh ProxyCommand through the session's relay port)."""
    sock = socket.create_connection(("127.0.0.1", port), CONNECT_TIMEOUT_S)
    sock.settimeout(None)

    def upward() -> None:
        while True:
            data = os.read(0, CHUNK)
            if not data:
                break
            sock.sendall(data)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=upward, daemon=True).start()
    while True:
        data = sock.recv(CHUNK)
        if not data:
            return 0
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]


def main(argv: List[str]) -> int:
    if len(argv) == 2 and argv[0] == "--pipe" and argv[1].isdigit():
        return pipe(int(argv[1]))
    if len(argv) != 1 or not argv[0].isdigit():
        sys.stderr.write("usage: relay.py PORT | relay.py --pipe PORT\n")
        return 2
    NodeEnd(int(argv[0]), Writer(sys.stdout.fileno())).serve(sys.stdin.buffer.readline)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
