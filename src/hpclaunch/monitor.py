"""Watch a job: follow its per-rank logs, wait for its end, turn that end into an exit code.

No Slurm calls here: states come from a `StatusSource` (backends/slurm.py asks squeue /
sacct) and the logs from the run directory (docs/internals.md), so all of it is tested
with real files and a scripted source.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Final, NamedTuple, Protocol, TextIO

# Exit codes of `hpclaunch run --wait` for states where no rank reported a failure
# (docs/internals.md). COMPLETED and FAILED are absent: their code depends on the ranks.
EXIT_UNKNOWN: Final = 120
EXIT_OTHER_FAILURE: Final = 125
EXIT_CODES: Final[Mapping[str, int]] = MappingProxyType(
    {
        "CANCELLED": 121,
        "NODE_FAIL": 122,
        "OUT_OF_MEMORY": 123,
        "TIMEOUT": 124,
        "BOOT_FAIL": EXIT_OTHER_FAILURE,
        "DEADLINE": EXIT_OTHER_FAILURE,
        "PREEMPTED": EXIT_OTHER_FAILURE,
        "REVOKED": EXIT_OTHER_FAILURE,
        "SPECIAL_EXIT": EXIT_OTHER_FAILURE,
    }
)

# States in which the job may still change; anything else is terminal.
ACTIVE_STATES: Final = frozenset(
    {
        "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
        "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
        "RESV_DEL_HOLD", "POWER_UP_NODE", "UPDATE_DB",
    }
)  # fmt: skip
# Active states in which the tasks may be writing logs (the rest show a status line).
_STREAMING_STATES: Final = frozenset({"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"})
# squeue's compact %t codes, so a source may hand them over unchanged.
_SHORT_STATES: Final = {
    "PD": "PENDING", "CF": "CONFIGURING", "R": "RUNNING", "CG": "COMPLETING",
    "CD": "COMPLETED", "F": "FAILED", "CA": "CANCELLED", "TO": "TIMEOUT", "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY", "BF": "BOOT_FAIL", "DL": "DEADLINE", "PR": "PREEMPTED",
    "S": "SUSPENDED", "RQ": "REQUEUED", "RS": "RESIZING", "SE": "SPECIAL_EXIT",
    "SI": "SIGNALING", "SO": "STAGE_OUT", "ST": "STOPPED", "RV": "REVOKED",
    "RH": "REQUEUE_HOLD", "RF": "REQUEUE_FED",
}  # fmt: skip

_RANK_FILE = re.compile(r"rank-(\d+)\.(out|err|exit)\Z")
_CHUNK = 1 << 20  # read growth in 1 MiB pieces: a chatty rank must not cost a huge buffer
_MAX_LINE = 64 << 10  # a line longer than this is printed in pieces (bounds memory per file)
_LOG_POLL_S = 0.2
_PENDING_FIRST_S, _PENDING_MAX_S = 0.25, 5.0
_RUNNING_FIRST_S, _RUNNING_MAX_S = 1.0, 10.0
_DRAIN_WAIT_S = 2.0


def normalize_state(state: str) -> str:
    """Slurm's state as one word: `CANCELLED by 1000`, `CANCELLED+`, `CA` -> `CANCELLED`."""
    words = state.split()
    word = words[0].rstrip("+").upper() if words else ""
    return _SHORT_STATES.get(word, word) or "UNKNOWN"


def exit_code_of(returncode: int) -> int:
    """A `subprocess` return code as a shell exit status: killed by signal N -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class _Tail:
    """How far one log file has been read, and its unfinished last line."""

    __slots__ = ("ino", "offset", "partial", "path", "rank", "to_err")

    def __init__(self, path: Path, rank: int | None, to_err: bool) -> None:
        self.path = path
        self.rank = rank  # None: batch.out
        self.to_err = to_err
        self.offset = 0
        self.ino: int | None = None
        self.partial = b""


class LogFollower:
    """Print what is new in a run's `logs/`, one complete line at a time, tagged by rank.

    Each poll lists the folder once and stats each followed file once; only the bytes that
    grew since the last poll are read, so thousands of rank files stay cheap. `rank` limits
    the rank files followed; `include_batch` decides about `batch.out` independently.
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
        self._ranks_tsv = _Tail(self._dir / "ranks.tsv", None, False)
        self._nodes: dict[int, str] = {}
        self._exited: set[int] = set()

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
        self._discover()
        self._read_ranks()
        printed = sum(self._pump(tail) for tail in self._order)
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
        self._out.flush()
        self._err.flush()
        return printed

    def _discover(self) -> None:
        if self._rank is not None:
            # One rank: its file names are known, no need to list a folder of thousands.
            names = [f"rank-{self._rank}.{ext}" for ext in ("out", "err")]
            if (self._dir / f"rank-{self._rank}.exit").exists():
                self._exited.add(self._rank)
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
            else:
                m = _RANK_FILE.match(name)
                if m is None:
                    continue
                if m.group(2) == "exit":
                    self._exited.add(int(m.group(1)))
                    continue
                tail = _Tail(self._dir / name, int(m.group(1)), m.group(2) == "err")
            self._tails[name] = tail
            added = True
        if added:
            self._order = sorted(
                self._tails.values(),
                key=lambda t: (-1 if t.rank is None else t.rank, t.to_err),
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
        return sum(self._write(tail, lines) for lines in self._lines(tail))

    def _read_ranks(self) -> None:
        for lines in self._lines(self._ranks_tsv):
            for line in lines:
                fields = line.decode("utf-8", "replace").split("\t")
                if len(fields) >= 2 and fields[0].strip().isdigit():
                    # A requeued rank appends a new line: the latest node wins.
                    self._nodes[int(fields[0])] = fields[1].strip() or "?"

    def _write(self, tail: _Tail, lines: list[bytes]) -> int:
        if not lines:
            return 0
        if not self._tag:
            prefix = ""
        elif tail.rank is None:
            prefix = "[batch] "
        else:
            prefix = f"[{self._nodes.get(tail.rank, '?')} {tail.rank}] "
        texts = [_visible(line.decode("utf-8", "replace"), self._tag) for line in lines]
        stream = self._err if tail.to_err else self._out
        _safe_write(stream, "".join(prefix + t + "\n" for t in texts))
        return len(lines)


def _utf8_cut(data: bytes, limit: int) -> int:
    """An index <= limit that does not split a UTF-8 sequence (so both halves decode)."""
    cut = limit
    while cut > limit - 4 and cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if cut > 0 else limit


def _visible(text: str, tagged: bool) -> str:
    """With tags, show a line as a terminal would: progress bars (`\\r` updates) -> last one."""
    if not tagged:
        return text
    text = text.rstrip("\r")
    return text.rsplit("\r", 1)[-1] if "\r" in text else text


def _safe_write(stream: TextIO, text: str) -> None:
    """Write text even to a stream whose encoding cannot hold it (e.g. ASCII locale)."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        enc = getattr(stream, "encoding", None) or "ascii"
        stream.write(text.encode(enc, "replace").decode(enc, "replace"))


def first_failure(log_dir: Path) -> int | None:
    """Exit code of the rank that failed first (earliest `time` in rank-*.exit), or None."""
    best: tuple[float, int, int] | None = None
    try:
        with os.scandir(log_dir) as it:
            names = [e.name for e in it]
    except OSError:
        return None
    for name in names:
        m = _RANK_FILE.match(name)
        if m is None or m.group(2) != "exit":
            continue
        try:
            record = json.loads((Path(log_dir) / name).read_text(encoding="utf-8"))
            rc, when = record["returncode"], float(record["time"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable or foreign: the other ranks still tell the story
        if not isinstance(rc, int) or isinstance(rc, bool) or rc == 0:
            continue
        key = (when, int(m.group(1)), exit_code_of(rc))  # ties: the lower rank
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


def _slurm_exit(code: str | None) -> int | None:
    """sacct's `exit:signal` (`3:0` -> 3, `0:9` -> 137); None when it says nothing."""
    if not code:
        return None
    head, _, sig = code.strip().partition(":")
    try:
        status, signum = int(head), int(sig or 0)
    except ValueError:
        return None
    if signum > 0:
        return 128 + signum
    return status if status > 0 else None


def job_exit_code(state: str, log_dir: Path, slurm_exit_code: str | None) -> int:
    """The exit code of `hpclaunch run --wait` for a job that ended in `state`."""
    state = normalize_state(state)
    if state in EXIT_CODES:
        # The state explains the ranks' deaths (scancel/timeout send SIGTERM, OOM SIGKILL):
        # reporting 143/137 there would hide why the job ended.
        return EXIT_CODES[state]
    failure = first_failure(log_dir)
    if failure is not None:
        return failure
    if state == "COMPLETED":
        return 0
    if state == "FAILED":
        code = _slurm_exit(slurm_exit_code)
        return code if code is not None else EXIT_UNKNOWN
    return EXIT_UNKNOWN


class JobStatus(NamedTuple):
    state: str
    reason: str
    exit_code: str | None


class StatusSource(Protocol):
    def status(self, job_id: str) -> JobStatus: ...


def _elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class _StatusLine:
    """One line about a waiting job: redrawn in place on a terminal, else on change only."""

    def __init__(self, stream: TextIO, is_tty: bool) -> None:
        self._stream = stream
        self._tty = is_tty
        self._shown: tuple[str, str] | None = None
        self._active = False

    def show(self, state: str, reason: str, elapsed: float) -> None:
        reason = "" if reason.strip() in ("", "None", "(null)") else reason.strip()
        text = state.lower() + (f" ({reason})" if reason else "") + f" ... {_elapsed(elapsed)}"
        if self._tty:
            # A wrapped line cannot be redrawn with \r: keep it within the terminal width.
            width = shutil.get_terminal_size((80, 24)).columns - 1
            _safe_write(self._stream, "\r" + text[:width] + "\x1b[K")
            self._active = True
        elif self._shown != (state, reason):
            _safe_write(self._stream, text + "\n")
        else:
            return
        self._shown = (state, reason)
        self._stream.flush()

    def end(self, keep: bool = False) -> None:
        """Clear the line, or (keep, on Ctrl-C) leave it visible and start a new line."""
        if self._active:
            self._stream.write("\n" if keep else "\r\x1b[K")
            self._stream.flush()
        self._active = False
        self._shown = None  # waiting again later (requeue) prints the line again


def wait_and_stream(
    source: StatusSource,
    job_id: str,
    log_dir: Path,
    out: TextIO,
    err: TextIO,
    *,
    is_tty: bool,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, str]:
    """Follow a job until it ends, streaming its logs; return (exit code, final state).

    Status calls back off (0.25 s -> 5 s pending, 1 s -> 10 s running) because this runs
    for hours against a shared slurmctld; a new rank-*.exit file brings the next call
    forward, since then the end is near. KeyboardInterrupt propagates unchanged.
    """
    follower = LogFollower(log_dir, out, err)
    line = _StatusLine(err, is_tty)
    start = clock()
    next_ask = start
    wait_iv, run_iv = _PENDING_FIRST_S, _RUNNING_FIRST_S
    streaming = False
    exits_seen = 0
    status = JobStatus("UNKNOWN", "", None)
    state = "UNKNOWN"
    try:
        while True:
            now = clock()
            if now >= next_ask:
                status = source.status(job_id)
                state = normalize_state(status.state)
                if state not in ACTIVE_STATES:
                    break
                if state in _STREAMING_STATES:
                    if not streaming:
                        streaming, run_iv = True, _RUNNING_FIRST_S
                        line.end()
                    next_ask = now + run_iv
                    run_iv = min(run_iv * 1.5, _RUNNING_MAX_S)
                else:
                    if streaming:
                        streaming, wait_iv = False, _PENDING_FIRST_S
                    next_ask = now + wait_iv
                    wait_iv = min(wait_iv * 2, _PENDING_MAX_S)
                    line.show(state, status.reason, now - start)
            if streaming:
                follower.poll()
                if len(follower.exited) > exits_seen:
                    exits_seen = len(follower.exited)
                    run_iv = _RUNNING_FIRST_S
                    next_ask = min(next_ask, clock() + run_iv)
                sleep(_LOG_POLL_S)
            else:
                # Wake at least every second so the elapsed time on a terminal moves.
                sleep(max(0.0, min(1.0, next_ask - clock())))
                if is_tty and clock() < next_ask:
                    line.show(state, status.reason, clock() - start)
    except BaseException:
        line.end(keep=True)
        raise
    line.end()
    # The shared file system may show exit files and last writes a little late: wait for
    # an exit file from every rank that started, at most a couple of seconds.
    deadline = clock() + _DRAIN_WAIT_S
    while True:
        follower.poll()
        started = set(follower.nodes)
        if (started and started <= follower.exited) or clock() >= deadline:
            break
        sleep(_LOG_POLL_S)
    follower.drain()
    return job_exit_code(state, log_dir, status.exit_code), state
