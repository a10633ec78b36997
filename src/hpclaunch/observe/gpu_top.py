"""`hpclaunch top`'s view of a run's GPUs: built from the samples (gpu_metrics), shown as
plain text (the same text, coloured, in the live view), or as JSON.

Two views: a running run's shows each GPU's latest sample and a sparkline of its busy %
over the last --span; a finished run's summarises what was recorded (mean busy %, peak
memory, mean power, samples, the sparkline over the whole run). The live view refreshes
the samples every REFRESH_S and asks the scheduler about the run (StatePoll) at most
every POLL_MIN_S, backing off to POLL_MAX_S while nothing changes.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from hpclaunch.basics import states
from hpclaunch.errors import Interrupted
from hpclaunch.observe import gpu_metrics
from hpclaunch.observe.gpu_metrics import InputBound, Series
from hpclaunch.records.runrecord import RunRecord

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

BLOCKS = "▁▂▃▄▅▆▇█"  # busy 0% .. 100%; a space: no sample in that stretch
SPARK_WIDTH = 30
DEFAULT_SPAN_S = 300
REFRESH_S = 2.0  # the CSVs are read again this often
POLL_MIN_S, POLL_MAX_S = 10.0, 60.0  # the scheduler is asked at most this often ... least
STALE_S = 30.0  # a running run's samples this old: the view says so
RIGHT = {1, 2, 3, 4, 5}  # the table's number columns (the sparkline is left-aligned)
NO_REASON = ("", "None", "(null)")  # what squeue says of a job without a reason


@dataclass
class Gpu:
    """One line of the view."""

    series: Series
    spark: str
    idle_share: Optional[float] = None  # named by an input-bound warning: its idle share


@dataclass
class View:
    record: RunRecord
    finished: bool  # the summary of a run that ended, else the latest samples
    span_s: float  # the sparklines' stretch of time
    now: float
    gpus: list[Gpu] = field(default_factory=list)
    warnings: list[InputBound] = field(default_factory=list)
    elapsed_s: Optional[float] = None
    first: Optional[float] = None  # the run's first and latest sample times
    last: Optional[float] = None
    unsampled: list[str] = field(default_factory=list)  # nodes that ran ranks, no samples


def sparkline(times: Sequence[float], values: Sequence[float], start: float, end: float,
              width: int = SPARK_WIDTH) -> str:  # fmt: skip
    """`values` (percent, NaN: no reading) from `start` to `end` in `width` characters:
    each the mean of the samples in its stretch of time, a space where there are none."""
    step = (end - start) / width if end > start else 0.0
    sums, counts = [0.0] * width, [0] * width
    for i in range(bisect.bisect_left(times, start), bisect.bisect_right(times, end)):
        if math.isnan(values[i]):
            continue
        cell = min(width - 1, int((times[i] - start) / step)) if step else width - 1
        sums[cell] += values[i]
        counts[cell] += 1
    top = len(BLOCKS) - 1
    return "".join(
        BLOCKS[max(0, min(top, round(s / n * top / 100)))] if n else " "
        for s, n in zip(sums, counts)
    )


def _start(record: RunRecord, first: Optional[float]) -> Optional[float]:
    """When the run began running: its first attempt's start, its ranks' first start,
    else its first sample (a run still pending has not begun)."""
    tried = [a.started_at for a in record.events.attempts if a.started_at]
    found = [t for t in (*tried[:1], record.events.first_start, first) if t is not None]
    return min(found) if found else None


def _elapsed(record: RunRecord, finished: bool, view: View) -> Optional[float]:
    begun = _start(record, view.first)
    if begun is None:
        return None
    if not finished:
        return max(0.0, view.now - begun)
    ends = [t for t in (record.events.last_end, record.ended_at, view.last) if t is not None]
    return max(0.0, max(ends) - begun) if ends else None


def build(record: RunRecord, found: Sequence[Series], warnings: Sequence[InputBound],
          span_s: float, now: Optional[float] = None) -> View:  # fmt: skip
    """The view of a run: its state decides between the latest samples and the summary."""
    finished = not states.is_open(record.state)
    view = View(record, finished, span_s, time.time() if now is None else now)
    view.warnings = list(warnings)
    used = [s for s in found if s.samples]
    if used:
        view.first = min(s.times[0] for s in used)
        view.last = max(s.times[-1] for s in used)
    view.elapsed_s = _elapsed(record, finished, view)
    named = {(n, g): share for w in warnings for n, g, share in w.gpus}
    end = view.last or 0.0
    start = (view.first or 0.0) if finished else end - span_s
    for one in used:
        spark = sparkline(one.times, one.busy, start, end)
        view.gpus.append(Gpu(one, spark, named.get((one.node, one.gpu))))
    sampled = {s.node for s in used}
    view.unsampled = [n for n in record.events.nodes if n not in sampled]
    return view


def duration(seconds: float) -> str:
    secs = int(seconds)
    hours, rest = divmod(secs, 3600)
    if hours:
        return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s"
    return f"{rest // 60}m{rest % 60:02d}s" if rest >= 60 else f"{secs}s"


def _figure(value: Optional[float], scale: float = 1.0, digits: int = 0) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


def _head(view: View) -> str:
    record = view.record
    job = f" (job {record.job_id})" if record.job_id else ""
    reason = "" if view.finished or record.reason.strip() in NO_REASON else record.reason
    state = record.state + (f" ({reason})" if reason else "")
    if view.elapsed_s is not None:
        state += f" {'after' if view.finished else 'for'} {duration(view.elapsed_s)}"
    nodes = len({g.series.node for g in view.gpus})
    count = f"{nodes} node{'s' * (nodes != 1)}, {len(view.gpus)} GPU{'s' * (len(view.gpus) != 1)}"
    return f"run {record.run_id}{job}: {state}; {count}"


def _when(view: View) -> str:
    if view.first is None or view.last is None:
        return ""
    if view.finished:
        return f"samples over {duration(view.last - view.first)}"
    age = max(0.0, view.now - view.last)
    stale = " (no new samples: is the GPU watch still running?)" if age > STALE_S else ""
    return f"latest sample {duration(age)} ago{stale}"


def _span_text(span_s: float) -> str:
    return f"{span_s / 60:g} MIN" if span_s % 60 == 0 else f"{span_s:g} S"


def _table(view: View) -> list[list[str]]:
    head = ["NODE", "GPU", "BUSY%", "MEM GiB", "POWER W"]
    if view.finished:
        head += ["SAMPLES", "BUSY% OVER THE RUN"]
    else:
        head += [f"BUSY% LAST {_span_text(view.span_s)}"]
    rows = [head]
    for one in view.gpus:
        s = one.series
        if view.finished:
            busy, mem, power = s.mean_busy_pct, s.peak_mem_mib, s.mean_power_w
        else:
            busy, mem, power = s.latest()[3:]
        cells = [s.node, str(s.gpu), _figure(busy), _figure(mem, 1024, 1), _figure(power)]
        cells += [str(s.samples)] if view.finished else []
        mark = "" if one.idle_share is None else f"  <- idle {one.idle_share:.0%}"
        rows.append([*cells, one.spark + mark])
    return rows


def lines(view: View) -> list[str]:
    """The view as plain text, one string a line."""
    out = [_head(view)]
    if view.gpus:
        when = _when(view)
        if view.finished:
            when += "; busy % and power: mean, memory: peak"
        out.append(when)
        rows = _table(view)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for row in rows:
            cells = [c.rjust(w) if i in RIGHT else c.ljust(w) for i, (c, w) in
                     enumerate(zip(row, widths))]  # fmt: skip
            out.append("  ".join([*cells, row[-1]]).rstrip())
    else:
        out.append("no GPU samples yet")
    if view.unsampled:
        out.append("no samples from " + ", ".join(view.unsampled))
    start = _start(view.record, view.first)
    for warning in view.warnings:
        at = f", after {duration(warning.time - start)}" if warning.time and start else ""
        out.append(f"warning ({warning.node}{at}): {warning.message}")
    return out


def styled(view: View) -> Text:
    """The same text for a terminal: the head bold, the warnings yellow."""
    from rich.text import Text

    text = Text()
    for number, line in enumerate(lines(view)):
        style = "bold" if number == 0 else "yellow" if line.startswith("warning") else ""
        text.append(line + "\n", style=style)
    return text


def _reading(value: Optional[float]) -> Optional[float]:
    return None if value is None or math.isnan(value) else value


def to_json(view: View) -> dict[str, Any]:
    record = view.record
    gpus = []
    for one in view.gpus:
        s = one.series
        latest = s.latest()
        gpus.append({
            "node": s.node, "gpu": s.gpu,
            "latest": {"time": latest.time, "busy_pct": latest.busy_pct,
                       "mem_mib": latest.mem_mib, "power_w": latest.power_w},
            "samples": s.samples, "first_time": s.times[0],
            "mean_busy_pct": s.mean_busy_pct, "peak_mem_mib": s.peak_mem_mib,
            "mean_power_w": s.mean_power_w, "sparkline": one.spark,
            "input_bound_idle_share": one.idle_share,
        })  # fmt: skip
    warnings = [
        {"node": w.node, "kind": w.kind, "gpus": [list(g) for g in w.gpus],
         "message": w.message, "time": w.time}
        for w in view.warnings
    ]  # fmt: skip
    return {
        "run_id": record.run_id, "job_id": record.job_id, "state": record.state,
        "finished": view.finished, "elapsed_s": view.elapsed_s, "span_s": view.span_s,
        "first_sample": view.first, "latest_sample": view.last,
        "gpus": gpus, "nodes_without_samples": view.unsampled, "warnings": warnings,
    }  # fmt: skip


class StatePoll:
    """When to ask the scheduler about the run again: POLL_MIN_S after a change, twice as
    long after each answer that changed nothing, at most POLL_MAX_S."""

    def __init__(self, now: float, floor_s: float = 0.0) -> None:
        self.floor_s = floor_s  # the profile's min_poll_interval (waiting.py): never closer
        self.wait_s = max(POLL_MIN_S, floor_s)
        self.due = now + self.wait_s

    def asked(self, now: float, changed: bool) -> None:
        wait_s = POLL_MIN_S if changed else min(POLL_MAX_S, self.wait_s * 2)
        self.wait_s = max(wait_s, self.floor_s)
        self.due = now + self.wait_s

    def soon(self, now: float) -> None:
        """Something suggests the run is ending (its samples stopped): ask in POLL_MIN_S."""
        self.wait_s = max(POLL_MIN_S, self.floor_s)
        self.due = min(self.due, now + self.wait_s)


@dataclass
class Live:
    """What the live loop needs from outside: the clock, sleep and the scheduler."""

    console: Console
    refresh: Callable[[Path], RunRecord]
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    floor_s: float = 0.0  # the cluster profile's min_poll_interval


def live(run_dir: Path, record: RunRecord, span_s: float, how: Live) -> Optional[View]:
    """Refresh the view until the run ends (its final view stays on screen, and is
    returned) or Ctrl-C (the last view stays; None)."""
    from rich.live import Live as RichLive

    reader, events = gpu_metrics.Reader(run_dir), gpu_metrics.Events(run_dir)
    poll, quiet_since, stalled = StatePoll(how.clock(), how.floor_s), how.clock(), False
    reader.update()
    view = build(record, reader.series(), events.update(), span_s, how.clock())
    with RichLive(console=how.console, auto_refresh=False, transient=False) as screen:
        try:
            while not view.finished:
                screen.update(styled(view), refresh=True)
                how.sleep(REFRESH_S)
                now = how.clock()
                if reader.update():
                    quiet_since, stalled = now, False
                elif not stalled and now - quiet_since > STALE_S and reader.offsets:
                    poll.soon(now)  # the samples stopped: the run may be ending (once)
                    stalled = True
                if now >= poll.due:
                    fresh = how.refresh(run_dir)
                    poll.asked(now, (fresh.state, fresh.reason) != (record.state, record.reason))
                    record = fresh
                view = build(record, reader.series(), events.update(), span_s, now)
        except KeyboardInterrupt as exc:
            if isinstance(exc, Interrupted):
                raise  # SIGTERM, SIGHUP: hpclaunch's own exit status
            return None
        screen.update(styled(view), refresh=True)
    return view
