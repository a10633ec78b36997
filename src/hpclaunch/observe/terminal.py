"""Rank output on a user's terminal: what a program may not send there (terminal_safe),
and writing to a stream whose encoding cannot hold the text (safe_write). Moved out of
observe/logs.py, which re-exports both."""

from __future__ import annotations

import re
from typing import TextIO

# What a rank may not send to the user's terminal: ESC unless it starts a colour (SGR)
# sequence `ESC [ digits;: m`, every other C0 control but TAB, LF, CR and BS, DEL, and the
# C1 controls (U+0080-U+009F; some terminals act on U+009B as CSI). A program's output
# could otherwise retitle the window, move the cursor over earlier lines, or send the
# OSC / DCS sequences some terminals answer by typing text into the user's shell.
_SGR = re.compile(r"\x1b\[[0-9;:]*m")
_CONTROL = re.compile(r"[\x00-\x07\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f-\x9f]")  # ESC aside
_UNSAFE = re.compile(r"\x1b(?!\[[0-9;:]*m)|" + _CONTROL.pattern)
_ESCAPED = {chr(code): f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}


def terminal_safe(text: str) -> str:
    """Rank output as it may be shown on a terminal: colours, `\\r` and `\\b` kept, every
    other control character shown as the text `\\xNN` (so `ESC ] 0 ; t BEL` reads
    `\\x1b]0;t\\x07`). Only for a terminal: log files and pipes keep the bytes."""
    # Fast paths, each one pass in C (the full substitution is several times slower):
    # most lines are printable; most others only add colours, tabs, \r or \b.
    if text.isprintable():
        return text
    if not _CONTROL.search(text) and text.count("\x1b") == len(_SGR.findall(text)):
        return text
    return _UNSAFE.sub(lambda found: _ESCAPED[found.group()], text)


def safe_write(stream: TextIO, text: str) -> None:
    """Write text even to a stream whose encoding cannot hold it (e.g. ASCII locale)."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        enc = getattr(stream, "encoding", None) or "ascii"
        stream.write(text.encode(enc, "replace").decode(enc, "replace"))
