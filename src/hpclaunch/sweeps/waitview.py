"""How `sweep wait` (and a local sweep in the foreground) shows a sweep: a progress bar
(done/running/pending/failed) on a terminal, a plain line whenever the counts change
elsewhere (logs, CI, pipes); a local sweep's summary at its end."""

from __future__ import annotations

from typing import Any, Optional, TextIO

from hpclaunch.backends.sweepstate import Sweep, best, point_row
from hpclaunch.basics import states
from hpclaunch.basics.states import State


def tally(sweep: Sweep) -> dict[str, int]:
    """done (completed), failed (ended otherwise), running, pending."""
    found = {"done": 0, "running": 0, "pending": 0, "failed": 0}
    for rec in sweep.points:
        state = states.parse(rec.state)
        if rec.state == State.COMPLETED:
            found["done"] += 1
        elif rec.state in (State.RUNNING, State.COMPLETING, State.CONFIGURING, State.STAGE_OUT):
            found["running"] += 1
        elif states.is_open(state):
            found["pending"] += 1
        else:
            found["failed"] += 1
    return found


def line(sweep: Sweep) -> str:
    t = tally(sweep)
    total = len(sweep.points)
    return (
        f"sweep {sweep.sweep_id}: {t['done']}/{total} done, {t['running']} running, "
        f"{t['pending']} pending, {t['failed']} failed"
    )


class Progress:
    def __init__(self, out: TextIO, is_tty: bool) -> None:
        self._out = out
        self._last = ""
        self._bar: Optional[Any] = None
        self._task: Any = None
        if is_tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[counts]}"),
                console=Console(file=out),
                transient=False,
            )
            self._bar.start()

    def show(self, sweep: Sweep) -> None:
        t = tally(sweep)
        counts = f"{t['running']} running, {t['pending']} pending, {t['failed']} failed"
        if self._bar is not None:
            if self._task is None:
                self._task = self._bar.add_task(
                    f"sweep {sweep.sweep_id}", total=len(sweep.points), counts=counts
                )
            self._bar.update(self._task, completed=t["done"] + t["failed"], counts=counts)
            return
        text = line(sweep)
        if text != self._last:
            self._out.write(text + "\n")
            self._out.flush()
            self._last = text

    def say(self, text: str) -> None:
        """A line above the bar (written as it is without one)."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
            return
        self._out.write(text + "\n")
        self._out.flush()

    def end(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def summary(sweep: Sweep, metric: Optional[str], direction: str) -> list[str]:
    """The end of a sweep run here: the counts per state, the best point by `metric`
    (given at submission), and where each failed point's logs are."""
    rows = sorted((point_row(sweep, rec) for rec in sweep.points), key=lambda r: r["index"])
    counts = ", ".join(f"{n} {s}" for s, n in sorted(sweep.counts().items()))
    lines = [f"sweep {sweep.sweep_id}: {len(rows)} points: {counts}"]
    if metric:
        top = best(rows, metric, direction)
        if top is None:
            lines.append(f"best ({metric}, {direction}): none (no point's result has {metric})")
        else:
            params = " ".join(f"{k}={v}" for k, v in (top.get("params") or {}).items())
            value = (top.get("result") or {}).get(metric)
            lines.append(
                f"best ({metric}, {direction}): point {top['index']}  {params}  {metric}={value}"
            )
    for row in rows:
        if row["state"] != State.COMPLETED:
            lines.append(
                f"point {row['index']} {row['state']} (exit {row['exit_code']}): "
                f"hpclaunch logs {sweep.sweep_id}:{row['index']}"
            )
    return lines
