"""hpclaunch dev's logic without the testbed (issue 36): the allocation's options, the
relay's frames and channels, the session's clock, the SSH config entry."""

from __future__ import annotations

import socket
import socketserver
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpclaunch import node
from hpclaunch.errors import UserError
from hpclaunch.sessions import allocation
from hpclaunch.sessions.relay import Relay


def test_session_time_defaults_to_the_profile_dev_time(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    given = allocation.session_options({"cluster": "lumi", "nodes": "1"}, tmp_path, env)
    assert given["time"] == "2:00:00"
    given = allocation.session_options({"cluster": "lumi", "time": "0:30:00"}, tmp_path, env)
    assert given["time"] == "0:30:00"


def test_a_local_profile_is_refused_in_one_line(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    with pytest.raises(UserError) as caught:
        allocation.session_options({"cluster": "local"}, tmp_path, env)
    assert "--cluster: local runs jobs on this machine" in caught.value.render()


# --- the relay, both ends on this machine (the node's end as its own process) ------------


class _Echo(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while True:
            data = self.request.recv(65536)
            if not data:
                return
            self.request.sendall(data.upper())


@pytest.fixture
def echo() -> Iterator[int]:
    server = _Echo(("127.0.0.1", 0), _EchoHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _node_end(port: int) -> list[str]:
    text = node.path(node.RELAY).read_text(encoding="utf-8")
    return [sys.executable, *node.PYTHON_FLAGS, "-c", text, str(port)]


def _talk(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while len(got) < len(payload):
            part = sock.recv(65536)
            if not part:
                break
            got += part
        return got


def test_relay_carries_many_connections_both_ways(echo: int) -> None:
    relay = Relay(_node_end(echo))
    try:
        big = bytes(range(97, 123)) * 40_000  # 1 MB: many frames each way
        results: dict[int, bytes] = {}

        def one(i: int) -> None:
            results[i] = _talk(relay.port, big if i == 0 else f"hello {i}".encode())

        workers = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert results[0] == big.upper()
        assert {results[i] for i in range(1, 8)} == {f"HELLO {i}".encode() for i in range(1, 8)}
        relay.ping()
    finally:
        relay.close()
    assert relay.proc.returncode == 0  # the node's end left at its stdin's end
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", relay.port), timeout=5).close()


def test_relay_to_a_port_where_nothing_listens_closes_the_connection() -> None:
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    relay = Relay(_node_end(port))
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as sock:
            sock.settimeout(30)
            assert sock.recv(10) == b""  # closed by the node's end, not left hanging
    finally:
        relay.close()
