"""A run's GPU samples, as the GPU watch recorded them (node/gpu_watch.py): pure data.

Each node's watch appends to <run>/metrics/gpu-<node>.csv (time, node, gpu, busy_pct,
mem_mib, power_w). `Reader` reads those files from a remembered byte offset, complete
lines only, so a live `hpclaunch top` of a long run reads each byte once; `hpclaunch plot`
reads them whole the same way. The samples become one `Series` per (node, gpu), in node
then GPU order, held as arrays of floats (NaN: no reading) beside running figures (mean
busy %, peak memory, mean power), so a refresh costs only the new lines.

Also here: the run's input-bound events (events.jsonl, through records.event_lines) and,
for a run without samples, the reason it could have none.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional

from hpclaunch.basics import states
from hpclaunch.config import layering
from hpclaunch.node import EVENTS, GPU_CSV, INPUT_BOUND, LOGS, METRICS, gpu_watch
from hpclaunch.records import runrecord
from hpclaunch.records.runrecord import RunRecord

Row = gpu_watch.Row
BLOCK = 1 << 20  # bytes read at a time: a long run's first read never holds a whole file
NAN = math.nan
GLOB = GPU_CSV % "*"


_NUMBER = rb"(-?\d+(?:\.\d+)?)"
# A line as gpu_watch.csv_lines writes it: numbers or nothing; read without gpu_watch.number
# (its general parsing costs seconds on a day of samples), to the same values.
_WRITTEN = re.compile(rb",".join([_NUMBER, rb"([^,]*)", _NUMBER, *[_NUMBER + b"?"] * 3]))


def parse_line(raw: bytes) -> Optional[Row]:
    """One complete line (without its newline) as gpu_watch.read_csv reads it; None for
    the header and for damaged lines."""
    written = _WRITTEN.fullmatch(raw)
    if written is not None:
        when, node, gpu, busy, mem, power = written.groups()
        return Row(float(when), node.decode(errors="replace"), int(float(gpu)),
                   None if busy is None else float(busy), None if mem is None else float(mem),
                   None if power is None else float(power))  # fmt: skip
    return gpu_watch.parse_line(raw.decode(errors="replace"))  # the general rule


def _value(reading: Optional[float]) -> float:
    return NAN if reading is None else reading


def _reading(value: float) -> Optional[float]:
    return None if math.isnan(value) else value


@dataclass
class Series:
    """One GPU's samples, oldest first, and its figures over all of them."""

    node: str
    gpu: int
    times: array[float] = field(default_factory=lambda: array("d"))
    busy: array[float] = field(default_factory=lambda: array("d"))  # NaN: no reading
    mem: array[float] = field(default_factory=lambda: array("d"))
    power: array[float] = field(default_factory=lambda: array("d"))
    _busy_sum: float = 0.0
    _busy_n: int = 0
    _power_sum: float = 0.0
    _power_n: int = 0
    peak_mem_mib: Optional[float] = None

    def add(self, row: Row) -> None:
        self.times.append(row.time)
        self.busy.append(_value(row.busy_pct))
        self.mem.append(_value(row.mem_mib))
        self.power.append(_value(row.power_w))
        if row.busy_pct is not None:
            self._busy_sum += row.busy_pct
            self._busy_n += 1
        if row.power_w is not None:
            self._power_sum += row.power_w
            self._power_n += 1
        if row.mem_mib is not None:
            self.peak_mem_mib = max(self.peak_mem_mib or row.mem_mib, row.mem_mib)

    @property
    def samples(self) -> int:
        return len(self.times)

    @property
    def mean_busy_pct(self) -> Optional[float]:
        return self._busy_sum / self._busy_n if self._busy_n else None

    @property
    def mean_power_w(self) -> Optional[float]:
        return self._power_sum / self._power_n if self._power_n else None

    def latest(self) -> Row:
        i = len(self.times) - 1
        busy, mem, power = (_reading(a[i]) for a in (self.busy, self.mem, self.power))
        return Row(self.times[i], self.node, self.gpu, busy, mem, power)

    def values(self, metric: str) -> array[float]:
        """busy_pct, mem_mib or power_w, one a sample (NaN: no reading)."""
        return {"busy_pct": self.busy, "mem_mib": self.mem, "power_w": self.power}[metric]


def _natural(text: str) -> tuple[Any, ...]:
    """nid2 before nid10: digits compare as numbers."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def csv_paths(run_dir: Path) -> list[Path]:
    """The run's gpu-<node>.csv files, in node order."""
    folder = run_dir / METRICS
    found = [p for p in folder.glob(GLOB) if p.is_file()] if folder.is_dir() else []
    return sorted(found, key=lambda p: _natural(p.name))


class Reader:
    """A run's samples, brought up to date by `update` (new complete lines only)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.offsets: dict[Path, int] = {}  # bytes read of each file: whole lines only
        self._series: dict[tuple[str, int], Series] = {}

    def update(self) -> int:
        """Read what was appended since the last call; returns how many samples."""
        paths = csv_paths(self.run_dir)
        if any(_size(p) < self.offsets.get(p, 0) for p in paths):
            self.offsets.clear()  # a file was replaced, not appended to: read all again
            self._series.clear()
        return sum(self._read(path) for path in paths)

    def _read(self, path: Path) -> int:
        added = 0
        try:
            with open(path, "rb") as handle:
                handle.seek(self.offsets.get(path, 0))
                while True:
                    block = handle.read(BLOCK)
                    end = block.rfind(b"\n") + 1  # a line still being written waits
                    if end == 0 and len(block) == BLOCK:
                        end = BLOCK  # no line is a megabyte long: damage, skipped
                    for raw in block[:end].split(b"\n")[:-1]:
                        row = parse_line(raw)
                        if row is not None:
                            self._add(row)
                            added += 1
                    self.offsets[path] = self.offsets.get(path, 0) + end
                    if len(block) < BLOCK:
                        break
                    handle.seek(self.offsets[path])  # back to the line cut by the block
        except OSError:
            pass  # gone or unreadable now: what was read stays, the next call tries again
        return added

    def _add(self, row: Row) -> None:
        key = (row.node, row.gpu)
        if key not in self._series:
            self._series[key] = Series(row.node, row.gpu)
        self._series[key].add(row)

    def series(self) -> list[Series]:
        """One a GPU, in node then GPU order."""
        return [self._series[k] for k in sorted(self._series, key=lambda k: (_natural(k[0]), k))]

    def lines(self) -> Iterator[bytes]:
        """The recorded lines read so far (each with its newline, as written), file by
        file in node order: the header and damaged lines left out."""
        for path in sorted(self.offsets, key=lambda p: _natural(p.name)):
            left = self.offsets[path]
            with open(path, "rb") as handle:
                for raw in handle:
                    left -= len(raw)
                    if left < 0:
                        break  # appended after the samples were read: not among them
                    if parse_line(raw.rstrip(b"\n")) is not None:
                        yield raw


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class InputBound(NamedTuple):
    """A node's watch judged GPUs input-bound (its first verdict; one a node)."""

    node: str
    kind: str  # gpu_watch.SOME_IDLE or ALL_IDLE
    gpus: list[tuple[str, int, float]]  # (node, gpu, idle share)
    message: str
    time: Optional[float]


def _input_bound(event: dict[str, Any]) -> Optional[InputBound]:
    gpus = []
    for item in event.get("gpus") or []:
        try:
            gpus.append((str(item[0]), int(item[1]), float(item[2])))
        except (TypeError, ValueError, IndexError):
            continue
    when = event.get("time")
    stamp = float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else None
    message = event.get("message")
    if not isinstance(message, str) or not message:
        return None
    return InputBound(str(event.get("node", "")), str(event.get("kind", "")), gpus, message, stamp)


class Events:
    """The run's input-bound events, read again only when events.jsonl changed."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._seen: Optional[tuple[int, int]] = None
        self.found: list[InputBound] = []

    def update(self) -> list[InputBound]:
        try:
            info = (self.run_dir / EVENTS).stat()
            seen = (info.st_size, info.st_mtime_ns)
        except OSError:
            seen = (0, 0)
        if seen != self._seen:
            self._seen = seen
            self.found = input_bound(self.run_dir)
        return self.found


def input_bound(run_dir: Path) -> list[InputBound]:
    """The run's input-bound events, oldest first."""
    found = []
    for event in runrecord.event_lines(run_dir):
        if event.get("event") == INPUT_BOUND:
            one = _input_bound(event)
            if one is not None:
                found.append(one)
    return found


NO_TOOL = "no " + ", ".join(gpu_watch.TOOLS) + " on PATH"  # the watch's line without a tool
_NOT_STARTED = {states.State.PENDING, states.State.CONFIGURING, states.State.POWER_UP_NODE}


def _spec(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / "spec.json").read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _watch_said(run_dir: Path) -> list[str]:
    """The GPU watch's own lines in logs/batch.out (where its stderr goes)."""
    said: list[str] = []
    try:
        with open(run_dir / LOGS / "batch.out", errors="replace") as handle:
            for line in handle:
                if line.startswith(gpu_watch.PREFIX):
                    said.append(line[len(gpu_watch.PREFIX) :].strip())
    except OSError:
        pass
    return said


def why_none(run_dir: Path, record: RunRecord) -> str:
    """Why a run has no GPU samples, as far as its folder tells (spec.json: the GPUs
    asked and the watch's interval, 0 for none; the record: --no-watch; batch.out: what
    the watch said)."""
    spec = _spec(run_dir)
    said = _watch_said(run_dir)
    missing = [s for s in said if s.startswith(NO_TOOL)]
    if spec.get("gpus_per_node") == 0:
        return "it asked for no GPUs (--gpus-per-node 0), so no GPU watch ran"
    if layering.recorded_options(record.options).no_watch:
        return "it ran with --no-watch"
    if spec.get("watch_interval_s") == 0:
        return "it had no GPU watch (local runs and steps of an allocation have none)"
    if missing:
        return f"no GPU tool on its nodes (logs/batch.out: {missing[0]})"
    if said:
        return f"the GPU watch said (logs/batch.out): {said[0]}"
    if record.state == states.State.CREATED or states.parse(record.state) in _NOT_STARTED:
        return f"it has not started ({record.state})"
    if states.is_active(record.state):
        return "none written yet: the GPU watch writes its first sample once the job runs"
    return "none were written (the GPU watch did not run: see logs/batch.out)"
