"""Rank output on a terminal (issue 24, item 6): colours (SGR), carriage returns and
backspaces pass; every other control or escape sequence a program prints (a window
title, a cursor move, OSC, other C0 and C1 controls) is shown as visible text; log files
and pipes keep the bytes."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import VENV_BIN, Hpc
from hpclaunch.observe.logs import LogFollower, terminal_safe

HPCLAUNCH = str(VENV_BIN / "hpclaunch")
TITLE = "\x1b]0;pwned\x07"
CURSOR_UP = "\x1b[2A"
RED = "\x1b[31m"
RESET = "\x1b[0m"
SGR = re.compile(r"\x1b\[[0-9;:]*m")
# Every character a terminal may act on, besides TAB, LF, CR and BS.
ACTIVE = re.compile(r"[\x00-\x07\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def test_colour_cr_and_backspace_pass_everything_else_is_shown() -> None:
    text = f"{RED}loss{RESET} 0.5\r\b{TITLE}{CURSOR_UP}\x9b2J\x00\x07\tend"
    assert terminal_safe(text) == (
        f"{RED}loss{RESET} 0.5\r\b\\x1b]0;pwned\\x07\\x1b[2A\\x9b2J\\x00\\x07\tend"
    )
    assert terminal_safe("\x1b[38;5;196mX\x1b[38:2::255:0:0mY\x1b[m") == (
        "\x1b[38;5;196mX\x1b[38:2::255:0:0mY\x1b[m"
    )
    assert terminal_safe("\x1b[?1049h\x1bP+q\x1b\\\x1b") == "\\x1b[?1049h\\x1bP+q\\x1b\\\\x1b"
    assert terminal_safe("plain ünïcode ✓") == "plain ünïcode ✓"


@given(st.text(alphabet=st.characters(max_codepoint=0x2FF)))
def test_nothing_but_colour_reaches_the_terminal(text: str) -> None:
    shown = terminal_safe(text)
    assert ACTIVE.sub("", SGR.sub("", shown)) == SGR.sub("", shown)  # no control left
    assert "\x1b" not in SGR.sub("", shown)  # ESC only as the start of a colour
    # CR and BS kept, each of them; each character shown is one of the input's or its
    # visible escape, in order.
    assert shown.count("\r") == text.count("\r") and shown.count("\b") == text.count("\b")
    assert shown == "".join(terminal_safe(char) if char != "\x1b" else "" for char in text) or (
        "\x1b" in text
    )


@given(
    st.lists(
        st.one_of(
            st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E)),
            st.sampled_from([RED, RESET, "\x1b[1;32m", "\x1b[38;5;2m", "\r", "\b", "\t"]),
        )
    )
)
def test_colour_and_text_pass_unchanged(parts: list[str]) -> None:
    text = "".join(parts)
    assert terminal_safe(text) == text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_follower_escapes_only_on_a_terminal(tmp_path: Path) -> None:
    raw = f"{RED}hi{RESET}{TITLE}{CURSOR_UP}\n"
    (tmp_path / "rank-0.out").write_text(raw)
    piped, on_tty = io.StringIO(), _Terminal()
    for stream in (piped, on_tty):
        LogFollower(tmp_path, stream, stream, tag=False).drain()
    assert piped.getvalue() == raw
    assert on_tty.getvalue() == f"{RED}hi{RESET}\\x1b]0;pwned\\x07\\x1b[2A\n"


def _under_a_pty(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the last holder of the terminal closed it
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=120)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_a_local_run_and_logs_show_escapes_on_a_terminal_log_keeps_bytes(tmp_path: Path) -> None:
    env = {
        "PATH": f"{VENV_BIN}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "HPCLAUNCH_CLUSTER": "local",
        "LANG": "C.UTF-8",
    }
    program = (
        "import sys; sys.stdout.write("
        f"{'step 1' + chr(13) + 'step 2 ' + TITLE + CURSOR_UP + RED + 'red' + RESET!r} + '\\n')"
    )
    shown = _under_a_pty([HPCLAUNCH, "run", "--", sys.executable, "-c", program], tmp_path, env)
    line = next(x for x in shown.splitlines() if "step 2" in x)
    # Tagged, a progress line shows its last state (after the \r), escapes made visible.
    assert line.endswith("m step 2 \\x1b]0;pwned\\x07\\x1b[2A" + RED + "red" + RESET), repr(shown)
    assert "\x1b]" not in shown and CURSOR_UP not in shown
    [log] = (tmp_path / "runs").glob("*/*/logs/rank-0.out")
    raw = "step 1\rstep 2 " + TITLE + CURSOR_UP + RED + "red" + RESET
    assert log.read_bytes() == (raw + "\n").encode()
    # `hpclaunch logs`, no tags: the same view, carriage return kept.
    shown = _under_a_pty([HPCLAUNCH, "logs", "last", "--no-tag"], tmp_path, env)
    assert f"step 1\rstep 2 \\x1b]0;pwned\\x07\\x1b[2A{RED}red{RESET}\r\n" in shown, repr(shown)
    piped = subprocess.run(
        [HPCLAUNCH, "logs", "last"], cwd=tmp_path, env=env, capture_output=True, check=False
    )
    assert TITLE.encode() in piped.stdout  # a pipe gets the bytes


@pytest.mark.testbed
def test_a_slurm_run_wait_shows_escapes_on_a_terminal(hpc: Hpc) -> None:
    """The same through `run --wait` of a Slurm job on the testbed (monitor's follower)."""
    program = f"import sys; sys.stdout.write({TITLE + CURSOR_UP + RED + 'red' + RESET!r} + '\\n')"
    argv = ["runuser", "-u", hpc.user, "--", "hpclaunch", "run", "--wait", "--", "python3", "-c"]
    shown = _under_a_pty([*argv, program], hpc.cwd, hpc.env)
    assert f"\\x1b]0;pwned\\x07\\x1b[2A{RED}red{RESET}\r\n" in shown, repr(shown)
    assert "\x1b]" not in shown and CURSOR_UP not in shown
    [log] = (hpc.cwd / "runs").glob("*/*/logs/rank-0.out")
    assert log.read_bytes() == (TITLE + CURSOR_UP + RED + "red" + RESET + "\n").encode()
