"""hpclaunch dev's logic without the testbed (issue 36): the allocation's options, the
relay's frames and channels, the session's clock, the SSH config entry."""

from __future__ import annotations

import os
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpclaunch import node
from hpclaunch.errors import UserError
from hpclaunch.node.relay import CLOSE, DATA, OPEN, PING, TEXT, Writer, read_frame
from hpclaunch.sessions import allocation, sshconfig
from hpclaunch.sessions.bridge import LaptopLink
from hpclaunch.sessions.clock import hold, left_text
from hpclaunch.sessions.laptop import View, take_port
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


# --- the session's clock ------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_clock_warns_at_10_and_2_minutes_then_ends_with_the_job(tmp_path: Path) -> None:
    clock, said, asked = _Clock(), [], []

    def state(_: Path) -> str:
        asked.append(clock.now)
        return "TIMEOUT" if clock.now >= 900 else "RUNNING"

    why = hold(
        tmp_path, 900, still_up=lambda: None, say=said.append,
        clock=clock, sleep=clock.sleep, ask_state=state,
    )  # fmt: skip
    assert why == "its job ended (TIMEOUT)"
    assert said == [
        "hpclaunch: warning: the session ends in 10 min",
        "hpclaunch: warning: the session ends in 2 min",
    ]
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert max(gaps) <= 10.5 and len(asked) < 120  # the wait's back-off, not every tick


def test_the_clock_ends_when_this_side_ends_and_skips_passed_warnings(tmp_path: Path) -> None:
    clock, said = _Clock(), []
    ends = iter([None, None, "the server ended"])
    why = hold(
        tmp_path, 300, still_up=lambda: next(ends), say=said.append,
        clock=clock, sleep=clock.sleep, ask_state=lambda _: "RUNNING",
    )  # fmt: skip
    assert why == "the server ended"
    assert said == []  # 5 minutes left at the start: the 10-minute mark passed already
    # The limit ends the steps first: the job's end is the reason once Slurm says it.
    says = iter(["RUNNING", "COMPLETING", "TIMEOUT"])
    why = hold(
        tmp_path, 300, still_up=lambda: "the relay ended", say=said.append,
        clock=clock, sleep=clock.sleep, ask_state=lambda _: next(says),
    )  # fmt: skip
    assert why == "its job ended (TIMEOUT)"
    assert left_text(7260) == "2 h 01 min" and left_text(119) == "1 min"
    assert left_text(55.5) == "55 s"


# --- the login node's side of a laptop: channels, lines, the heartbeat ---------------------


def test_the_laptop_link_relays_channels_and_ends_on_silence(echo: int) -> None:
    laptop_in_r, laptop_in_w = os.pipe()  # the laptop's frames -> the link's stdin
    up_r, up_w = os.pipe()  # the link's stdout -> the laptop
    clock = _Clock()
    link = LaptopLink(30, stdin=os.fdopen(laptop_in_r, "rb"), stdout_fd=up_w, clock=clock)
    up = os.fdopen(up_r, "rb")
    laptop = Writer(laptop_in_w)
    assert read_frame(up.readline) == (0, TEXT, b'{"heartbeat": 30}')
    laptop.send(5, OPEN)  # before the server answers: refused
    assert read_frame(up.readline) == (5, CLOSE, b"")
    link.ready(echo, {"ready": "/?token=t", "token": "t"})
    assert read_frame(up.readline) == (0, TEXT, b'{"ready": "/?token=t", "token": "t"}')
    laptop.send(6, OPEN)
    laptop.send(6, DATA, b"hi")
    assert read_frame(up.readline) == (6, DATA, b"HI")
    assert link.still_up() is None
    clock.now += 31
    assert "the laptop was silent for 31 s" in str(link.still_up())
    laptop.send(0, PING)
    assert read_frame(up.readline) == (0, PING, b"")
    assert link.still_up() is None  # heard again
    os.close(laptop_in_w)
    link.thread.join(10)
    assert link.still_up() == "the laptop closed the connection"


def test_the_laptop_keeps_its_port_option_and_prints_its_own_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    words = ["dev", "--jupyter", "--port", "8888", "--env=A=1", "--", "--port", "1"]
    assert take_port(words) == (["dev", "--jupyter", "--env=A=1", "--", "--port", "1"], 8888)
    assert take_port(["dev", "--port=9"]) == (["dev"], 9)
    view = View()
    view.port = 4242
    assert view.ping_every is None  # no ping before the login node speaks
    view.text(b'{"heartbeat": 6}')
    assert view.ping_every == 2.0
    view.text(b'{"line": "hpclaunch: on node1"}')
    view.text(b'{"ready": "/?token=t"}')
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "hpclaunch: on node1",
        "hpclaunch: Jupyter (on this machine): http://127.0.0.1:4242/?token=t",
    ]


# --- --vscode: the ssh config entry, the sshd's environment ------------------------------


def test_the_ssh_entry_goes_first_and_leaves_the_rest_as_it_was(tmp_path: Path) -> None:
    config = tmp_path / ".ssh" / "config"
    config.parent.mkdir(mode=0o700)
    mine = "Host *\n    User someone\n\nHost lumi\n    HostName lumi.csc.fi\n"
    config.write_text(mine)
    config.chmod(0o640)
    name = sshconfig.host_name("20261126-1-a")
    text = sshconfig.entry(name, "hpcuser", tmp_path / "my key", tmp_path / "kh", 4242)
    sshconfig.add(config, text)
    written = config.read_text()
    assert written.startswith("# hpclaunch-20261126-1-a: hpclaunch dev") and written.endswith(mine)
    assert f"Host {name}\n" in written and "    User hpcuser\n" in written
    assert f"    IdentityFile '{tmp_path}/my key'\n" in written  # quoted: a space
    assert "    HostKeyAlias hpclaunch-20261126-1-a\n" in written
    proxy = next(ln for ln in written.splitlines() if "ProxyCommand" in ln)
    assert proxy.endswith(" --pipe 4242") and "relay.py" in proxy
    assert config.stat().st_mode & 0o777 == 0o640  # the user's mode kept
    sshconfig.remove(config, name)
    assert config.read_text() == mine
    fresh = tmp_path / "none" / ".ssh" / "config"
    sshconfig.add(fresh, text)
    assert fresh.stat().st_mode & 0o777 == 0o600
    assert fresh.parent.stat().st_mode & 0o777 == 0o700


def test_the_sshd_logins_get_the_steps_environment_back(tmp_path: Path) -> None:
    """save keeps the step's environment in a private folder of TMPDIR and hands sshd
    (here a stand-in that runs its ForceCommand as a login would) the command that puts
    it back; the folder goes when sshd ends."""
    keeper = str(node.path(node.DEV_SSHD))
    login = {"SSH_ORIGINAL_COMMAND": "echo $RUN_MARK $PATH $HOME $SSH_CONNECTION",
             "SSH_CONNECTION": "127.0.0.1 1 127.0.0.1 2", "HOME": "/login-home",
             "PATH": "/usr/bin:/bin"}  # fmt: skip
    fake_sshd = (
        "import json, subprocess, sys, os\n"
        "force = sys.argv[-1].split('=', 1)[1]\n"
        "print(sorted(os.listdir(os.environ['TMPDIR'])), flush=True)\n"
        "print(oct(os.stat(force.split()[-1]).st_mode & 0o777), flush=True)\n"
        f"subprocess.run(['/bin/sh', '-c', force], env={login!r})\n"
    )
    step = {"PATH": "/venv/bin:/usr/bin:/bin", "RUN_MARK": "r-1", "HOME": "/step-home",
            "TMPDIR": str(tmp_path)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-I", "-S", keeper, "save", "--", sys.executable, "-c", fake_sshd, "-o"],
        env=step, capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[0].startswith("['hpclaunch-dev-") and lines[1] == "0o600", lines
    assert lines[2].split() == [
        "r-1", "/venv/bin:/usr/bin:/bin", "/login-home", "127.0.0.1", "1", "127.0.0.1", "2"
    ]  # fmt: skip
    assert list(tmp_path.iterdir()) == []  # nothing left of the saved environment
