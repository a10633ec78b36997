"""Follow a run's per-rank log files and print their new lines tagged `[node rank]`.

Files and their layout: docs/internals.md (logs/rank-R.out|err, ranks.tsv, batch.out;
node-<node>.log and exits.jsonl above node_logs_above ranks: nodelogs.py, console.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from hpclaunch.node import ERR, EXIT, EXITS, OUT, RANKS_TSV
from hpclaunch.node import RANK_FILE as RANK_NAME
from hpclaunch.observe import nodelogs
from hpclaunch.observe.console import NodeLines
from hpclaunch.observe.terminal import safe_write as safe_write
from hpclaunch.observe.terminal import terminal_safe as terminal_safe
from hpclaunch.records.runpaths import ATTEMPT_PREFIX, attempt_numbers

# rank-R.out|err|exit, as node.RANK_FILE names them: group 1 the rank, group 2 the kind.
RANK_FILE = re.compile(
    re.escape(RANK_NAME).replace("%d", r"(\d+)").replace("%s", f"({OUT}|{ERR}|{EXIT})") + r"\Z"
)
_CHUNK = 1 << 20  # read growth in 1 MiB pieces: a chatty rank must not cost a huge buffer
_MAX_LINE = 64 << 10  # a line longer than this is printed in pieces (bounds memory per file)


class _Tail:
    """How far one log file has been read, and its unfinished last line."""

    __slots__ = ("ino", "node", "offset", "partial", "path", "rank", "shown", "to_err")

    def __init__(self, path: Path, rank: int | None, to_err: bool, node: bool = False) -> None:
        self.path = path
        self.rank = rank  # None: batch.out or a node file
        self.node = node  # a node file: every line tagged `[node rank] ` in the file
        self.to_err = to_err
        self.offset = 0
        self.ino: int | None = None
        self.partial = b""
        self.shown = b""  # the progress segment drawn on the terminal's last line


class LogFollower:
    """Print what is new in a run's `logs/`, one complete line at a time, tagged by rank.

    Each poll lists the folder once and stats each followed file once; only the bytes that
    grew since the last poll are read, so thousands of rank files stay cheap. `rank` limits
    the rank files followed; `include_batch` decides about `batch.out` independently.
    A job's node files (above node_logs_above ranks) give one rank's lines with `rank`,
    else what console.py lets through (rank 0, warnings and errors grouped).
    """

    def __init__(
        self,
        log_dir: Path,
        out: TextIO,
        err: TextIO,
        *,
        rank: int | None = None,
        include_batch: bool = True,
        tag: bool = True,
    ) -> None:
        self._dir = Path(log_dir)
        self._out = out
        self._err = err
        self._rank = rank
        self._include_batch = include_batch
        self._tag = tag
        self._tails: dict[str, _Tail] = {}
        self._order: list[_Tail] = []
        self._ranks_tsv = _Tail(self._dir / RANKS_TSV, None, False)
        self._exits = _Tail(self._dir / EXITS, None, False)
        self._node_lines = NodeLines(rank)
        self._nodes: dict[int, str] = {}
        self._exited: set[int] = set()
        self._live: _Tail | None = None  # whose progress the terminal's last line shows

    @property
    def nodes(self) -> Mapping[int, str]:
        """Rank -> node, as read from ranks.tsv so far."""
        return MappingProxyType(self._nodes)

    @property
    def exited(self) -> frozenset[int]:
        """Ranks whose rank-R.exit file has been seen."""
        return frozenset(self._exited)

    def poll(self) -> int:
        """Print the complete lines that are new since the last call; return how many."""
        self._read_ranks()
        self._discover()
        printed = sum(self._pump(tail) for tail in self._order)
        printed += self._write_held(final=False)
        for tail in self._order:
            self._draw_progress(tail)
        if printed:
            self._out.flush()
            self._err.flush()
        return printed

    def drain(self) -> int:
        """Print everything left, a final line without newline included."""
        printed = self.poll()
        for tail in self._order:
            if tail.partial:
                printed += self._write(tail, [tail.partial])
                tail.partial = b""
        printed += self._write_held(final=True)
        self._out.flush()
        self._err.flush()
        return printed

    def _discover(self) -> None:
        if self._rank is not None:
            # One rank: its file names are known, no need to list a folder of thousands.
            names = [RANK_NAME % (self._rank, kind) for kind in (OUT, ERR)]
            if (self._dir / (RANK_NAME % (self._rank, EXIT))).exists():
                self._exited.add(self._rank)
            if self._rank in self._nodes:  # node files: the one of its node
                names.append(nodelogs.node_file(self._nodes[self._rank]))
        else:
            try:
                with os.scandir(self._dir) as it:
                    names = [e.name for e in it]
            except OSError:  # the folder appears once the job starts
                names = []
        if self._include_batch:
            names.append("batch.out")
        added = False
        for name in names:
            if name in self._tails:
                continue
            if name == "batch.out":
                tail = _Tail(self._dir / name, None, True)
            elif nodelogs.NODE_FILE_RE.match(name):
                tail = _Tail(self._dir / name, None, False, node=True)
            else:
                m = RANK_FILE.match(name)
                if m is None:
                    continue
                if m.group(2) == EXIT:
                    self._exited.add(int(m.group(1)))
                    continue
                tail = _Tail(self._dir / name, int(m.group(1)), m.group(2) == ERR)
            self._tails[name] = tail
            added = True
        if added:
            self._order = sorted(
                self._tails.values(),
                key=lambda t: (-2 + t.node if t.rank is None else t.rank, t.to_err, t.path.name),
            )

    def _grown(self, tail: _Tail) -> int:
        """Bytes to read now (0 when absent or unchanged); restart a replaced/truncated file."""
        try:
            st = os.stat(tail.path)
        except OSError:
            return 0
        if st.st_ino != tail.ino or st.st_size < tail.offset:
            # A requeued job's batch.out is truncated by Slurm; a new file starts over.
            if tail.ino is not None:
                tail.offset, tail.partial = 0, b""
            tail.ino = st.st_ino
        return max(0, st.st_size - tail.offset)

    def _chunks(self, tail: _Tail) -> Iterator[bytes]:
        """The bytes that grew, piece by piece, up to the size stat saw (a writer faster
        than us cannot keep one poll going, and a burst of output is never held whole)."""
        left = self._grown(tail)
        if not left:
            return
        try:
            with open(tail.path, "rb") as f:
                f.seek(tail.offset)
                while left > 0 and (chunk := f.read(min(_CHUNK, left))):
                    tail.offset += len(chunk)
                    left -= len(chunk)
                    yield chunk
        except OSError:
            return  # removed meanwhile: what was read is kept

    def _lines(self, tail: _Tail) -> Iterator[list[bytes]]:
        """The complete lines that grew, chunk by chunk; over-long ones in pieces."""
        for chunk in self._chunks(tail):
            lines = (tail.partial + chunk).split(b"\n")
            tail.partial = lines.pop()
            while len(tail.partial) > _MAX_LINE:
                cut = _utf8_cut(tail.partial, _MAX_LINE)
                lines.append(tail.partial[:cut])
                tail.partial = tail.partial[cut:]
            yield lines

    def _pump(self, tail: _Tail) -> int:
        write = self._write_node if tail.node else self._write
        return sum(write(tail, lines) for lines in self._lines(tail))

    def _write_node(self, tail: _Tail, lines: list[bytes]) -> int:
        """A node file's lines: one rank's (`rank`), else what the console shows."""
        shown = self._node_lines.shown(lines)
        for node, rank, _ in shown:
            self._nodes.setdefault(rank, node)
        return sum(self._write(_Tail(tail.path, rank, False), [text]) for _, rank, text in shown)

    def _write_held(self, final: bool) -> int:
        """The warnings and errors of other ranks whose grouping window has passed."""
        if lines := self._node_lines.due(final):
            self._clear_progress()
            terminal = _is_terminal(self._out)
            texts = [terminal_safe(line) if terminal else line for line in lines]
            safe_write(self._out, "".join(text + "\n" for text in texts))
        return len(lines)

    def _read_ranks(self) -> None:
        for lines in self._lines(self._exits):  # node files: one exit record a line
            for record in map(nodelogs.parse_exit, (b.decode("utf-8", "replace") for b in lines)):
                if record is not None and self._rank in (None, record.rank):
                    self._exited.add(record.rank)
        for lines in self._lines(self._ranks_tsv):
            for line in lines:
                fields = line.decode("utf-8", "replace").split("\t")
                if len(fields) >= 2 and fields[0].strip().isdigit():
                    # A requeued rank appends a new line: the latest node wins.
                    self._nodes[int(fields[0])] = fields[1].strip() or "?"

    def _prefix(self, tail: _Tail, terminal: bool) -> str:
        if not self._tag:
            return ""
        if tail.rank is None:
            prefix = "[batch] "
        else:
            prefix = f"[{self._nodes.get(tail.rank, '?')} {tail.rank}] "
        if terminal and _colour_allowed:
            # One colour per rank, so that interleaved ranks stay apart on a terminal.
            colour = _COLOURS[(tail.rank or 0) % len(_COLOURS)] if tail.rank is not None else "2"
            prefix = f"\x1b[{colour}m{prefix.rstrip()}\x1b[0m "
        return prefix

    def _write(self, tail: _Tail, lines: list[bytes]) -> int:
        if not lines:
            return 0
        stream = self._err if tail.to_err else self._out
        terminal = _is_terminal(stream)
        self._clear_progress()  # a complete line takes the progress bar's place
        prefix = self._prefix(tail, terminal)
        texts = [_visible(line.decode("utf-8", "replace"), self._tag) for line in lines]
        if terminal:  # the program's own escapes are shown, not acted on; files keep them
            texts = [terminal_safe(text) for text in texts]
        safe_write(stream, "".join(prefix + t + "\n" for t in texts))
        return len(lines)

    def _draw_progress(self, tail: _Tail) -> None:
        """On a terminal, a rank's unfinished line that a `\r` rewrites (tqdm) is shown as
        it comes: its latest segment, tagged, redrawn in place while it stays the last line
        drawn (another rank's bar ends it with a newline). Pipes wait for the whole line."""
        segment = _progress_segment(tail.partial) if self._tag and not tail.node else b""
        stream = self._err if tail.to_err else self._out
        if not segment or segment == tail.shown or not _is_terminal(stream):
            return
        if self._live is not None and self._live is not tail:
            safe_write(self._stream_of(self._live), "\n")  # keep the other rank's bar
            self._live.shown = b""
        text = terminal_safe(_decode_whole(segment))
        safe_write(stream, f"\r{self._prefix(tail, True)}{text}\x1b[K")
        stream.flush()
        self._live, tail.shown = tail, segment

    def _clear_progress(self) -> None:
        """Erase the progress line drawn last; the next poll draws it again, below."""
        live, self._live = self._live, None
        if live is not None:
            stream = self._stream_of(live)
            safe_write(stream, "\r\x1b[K")
            stream.flush()
            live.shown = b""

    def _stream_of(self, tail: _Tail) -> TextIO:
        return self._err if tail.to_err else self._out


class AttemptFollower:
    """A run's logs across its attempts (--requeue): batch.out and a plain run's rank files
    in logs/, a requeued run's rank files in the latest logs/attempt-N/, switching (and
    saying so) when the next attempt's folder appears. The same calls as LogFollower."""

    def __init__(
        self,
        logs_dir: Path,
        out: TextIO,
        err: TextIO,
        *,
        rank: int | None = None,
        include_batch: bool = True,
        tag: bool = True,
        announce: bool = True,
    ) -> None:
        self._logs = Path(logs_dir)
        self._streams = (out, err)
        self._rank, self._tag, self._announce = rank, tag, announce
        self._base = LogFollower(
            self._logs, out, err, rank=rank, include_batch=include_batch, tag=tag
        )
        self._attempt: tuple[int, LogFollower] | None = None

    @property
    def rank_dir(self) -> Path:
        """Where the ranks of the attempt followed now write (logs/ without attempts)."""
        return self._logs / f"{ATTEMPT_PREFIX}{self._attempt[0]}" if self._attempt else self._logs

    @property
    def nodes(self) -> Mapping[int, str]:
        return (self._attempt[1] if self._attempt else self._base).nodes

    @property
    def exited(self) -> frozenset[int]:
        return (self._attempt[1] if self._attempt else self._base).exited

    def poll(self) -> int:
        printed = self._base.poll()
        numbers = attempt_numbers(self._logs.parent)
        if numbers and (self._attempt is None or numbers[-1] > self._attempt[0]):
            if self._attempt is not None:
                printed += self._attempt[1].drain()
            number = numbers[-1]
            if self._announce and number > 0:
                safe_write(self._streams[1], f"hpclaunch: attempt {number} started\n")
            follower = LogFollower(
                self._logs / f"{ATTEMPT_PREFIX}{number}",
                *self._streams,
                rank=self._rank,
                include_batch=False,
                tag=self._tag,
            )
            self._attempt = (number, follower)
        if self._attempt is not None:
            printed += self._attempt[1].poll()
        return printed

    def drain(self) -> int:
        printed = self.poll()
        printed += self._base.drain()
        if self._attempt is not None:
            printed += self._attempt[1].drain()
        return printed


def _utf8_cut(data: bytes, limit: int) -> int:
    """An index <= limit that does not split a UTF-8 sequence (so both halves decode)."""
    cut = limit
    while cut > limit - 4 and cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if cut > 0 else limit


_COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93", "95", "92", "94", "91")
_colour_allowed = True  # cleared by configure(no_color=True): NO_COLOR (no-color.org)


def configure(*, no_color: bool) -> None:
    """What the CLI learnt from its environment (NO_COLOR set: plain tags everywhere)."""
    global _colour_allowed
    _colour_allowed = not no_color


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _progress_segment(partial: bytes) -> bytes:
    """The latest `\r` segment of an unfinished line that holds a `\r`, else b""."""
    if b"\r" not in partial:
        return b""
    segments = [piece for piece in partial.split(b"\r") if piece]
    return segments[-1] if segments else b""


def _decode_whole(data: bytes) -> str:
    """data as text, a multi-byte character cut off at its end left out (not shown as
    a replacement character: the rest of it arrives with the next write)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":
            return data[: exc.start].decode("utf-8", "replace")
        return data.decode("utf-8", "replace")


def _visible(text: str, tagged: bool) -> str:
    """With tags, show a line as a terminal would: progress bars (`\\r` updates) -> last one."""
    if not tagged:
        return text
    text = text.rstrip("\r")
    return text.rsplit("\r", 1)[-1] if "\r" in text else text
