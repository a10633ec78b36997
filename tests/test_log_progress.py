"""Carriage-return progress bars (tqdm) as `logs --follow` and a waiting `run` show them
(issue #28 item 7): on a terminal a rank's `\\r` updates appear as they come, its latest
segment tagged and redrawn in place; a pipe still gets whole lines; the log files are
the program's bytes (the follower only reads them)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpclaunch.observe import logs
from hpclaunch.observe.logs import LogFollower


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _plain_tags() -> Iterator[None]:
    logs.configure(no_color=True)  # tags without colour codes, to compare the text
    yield
    logs.configure(no_color=False)


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_a_ranks_progress_is_shown_as_it_comes_and_redrawn_in_place(tmp_path: Path) -> None:
    err = tmp_path / "rank-0.err"
    term = _Terminal()
    follower = LogFollower(tmp_path, term, term, include_batch=False)
    _append(err, b"epoch 1\n\r  0%|          | 0/10")
    follower.poll()
    assert term.getvalue() == "[? 0] epoch 1\n\r[? 0]   0%|          | 0/10\x1b[K"
    _append(err, "\r 50%|█████     | 5/10".encode())
    follower.poll()
    assert term.getvalue().endswith("\r[? 0]  50%|█████     | 5/10\x1b[K")
    before = term.getvalue()
    follower.poll()  # nothing new: nothing redrawn
    assert term.getvalue() == before
    _append(err, "\r100%|██████████| 10/10\n".encode())
    follower.poll()
    assert term.getvalue() == before + "\r\x1b[K[? 0] 100%|██████████| 10/10\n"
    assert err.read_bytes().count(b"\r") == 3  # the file keeps the program's bytes


def test_a_multibyte_character_cut_by_a_write_is_not_shown_half(tmp_path: Path) -> None:
    term = _Terminal()
    follower = LogFollower(tmp_path, term, term, include_batch=False)
    _append(tmp_path / "rank-0.err", "\r 10%|█".encode()[:-1])
    follower.poll()
    assert term.getvalue() == "\r[? 0]  10%|\x1b[K"


def test_another_ranks_line_clears_the_bar_which_comes_back_below(tmp_path: Path) -> None:
    term = _Terminal()
    follower = LogFollower(tmp_path, term, term, include_batch=False)
    _append(tmp_path / "rank-0.err", b"\r 10%|")
    follower.poll()
    _append(tmp_path / "rank-1.out", b"loss 0.5\n")
    follower.poll()
    assert term.getvalue() == "\r[? 0]  10%|\x1b[K\r\x1b[K[? 1] loss 0.5\n\r[? 0]  10%|\x1b[K"


def test_two_ranks_bars_each_keep_a_line(tmp_path: Path) -> None:
    term = _Terminal()
    follower = LogFollower(tmp_path, term, term, include_batch=False)
    _append(tmp_path / "rank-0.err", b"\r 10%|")
    _append(tmp_path / "rank-1.err", b"\r 20%|")
    follower.poll()
    assert term.getvalue() == "\r[? 0]  10%|\x1b[K\n\r[? 1]  20%|\x1b[K"


def test_a_pipe_gets_only_whole_lines(tmp_path: Path) -> None:
    pipe = io.StringIO()
    follower = LogFollower(tmp_path, pipe, pipe, include_batch=False)
    _append(tmp_path / "rank-0.err", b"\r 10%|\r 20%|")
    follower.poll()
    assert pipe.getvalue() == ""
    _append(tmp_path / "rank-0.err", b"\r100%|\n")
    follower.poll()
    assert pipe.getvalue() == "[? 0] 100%|\n"
