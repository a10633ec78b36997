"""`hpclaunch plot`: a run's GPU samples over time, as a PNG and as CSV.

The PNG: one panel per node (stacked; more than ROWS_PER_COLUMN nodes: a grid, row by
row), one line per GPU of the node; a GPU index has the same colour on every node, so one
legend serves all panels. x: minutes since the run's first sample; y: busy %, memory used (GiB) or
power (W); a sample without that reading leaves a gap. Drawn through matplotlib's Agg
canvas at exactly the asked pixels (the house style of sweeps/plot.py, whose size
parsing and hint this reuses); matplotlib is imported only here, only for a PNG.

The CSV (--data): the plotted samples exactly as recorded (the watch's lines, byte for
byte, file by file in node order) under the watch's own header.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, Optional

from hpclaunch.errors import UserError
from hpclaunch.node import gpu_watch
from hpclaunch.observe.figure import DEFAULT_SIZE, DPI, HINT, parse_size
from hpclaunch.observe.gpu_metrics import Reader, Series

__all__ = ["HINT", "METRICS", "default_size", "parse_size", "png", "write_data"]

ROWS_PER_COLUMN = 4  # more nodes than this: panels side by side
ROW_PX = 200  # the default height grows by this per further row of panels


class Metric(NamedTuple):
    column: str  # in the CSV and gpu_metrics.Series.values
    label: str  # the y axis
    scale: float  # recorded unit -> plotted unit
    top: Optional[float]  # a fixed upper end of the y axis


METRICS = {
    "busy": Metric("busy_pct", "busy %", 1.0, 105.0),
    "mem": Metric("mem_mib", "memory used (GiB)", 1 / 1024, None),
    "power": Metric("power_w", "power (W)", 1.0, None),
}


def _nodes(found: Sequence[Series]) -> list[str]:
    return list(dict.fromkeys(s.node for s in found))  # in the series' (node) order


def _grid(nodes: int) -> tuple[int, int]:
    columns = max(1, math.ceil(nodes / ROWS_PER_COLUMN))
    return math.ceil(nodes / columns), columns


def default_size(found: Sequence[Series]) -> tuple[int, int]:
    """800x500 for one row of panels, ROW_PX taller for each further row."""
    rows, _ = _grid(len(_nodes(found)))
    width, height = DEFAULT_SIZE
    return width, height + ROW_PX * (rows - 1)


def write_data(reader: Reader, path: Path) -> None:
    """The samples `reader` read, as recorded, under the CSV header."""
    try:
        with open(path, "wb") as handle:
            handle.write(gpu_watch.HEADER.encode())
            for line in reader.lines():
                handle.write(line)
    except OSError as exc:
        raise UserError("--data", f"cannot write {path}: {exc.strerror}", "", "") from None


def png(run_id: str, found: Sequence[Series], metric: str, path: Path,
        size: tuple[int, int]) -> bool:  # fmt: skip
    """Draw the samples into a PNG of exactly `size` pixels; False without matplotlib."""
    try:
        import matplotlib  # first: a blocked matplotlib fails here
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    shown = METRICS[metric]
    nodes = _nodes(found)
    rows, columns = _grid(len(nodes))
    fig = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    panels = fig.subplots(rows, columns, sharex=True, sharey=True, squeeze=False).flatten()
    start = min(s.times[0] for s in found)
    gpus = sorted({s.gpu for s in found})
    colours = matplotlib.colormaps["tab10" if len(gpus) <= 10 else "tab20"]
    legend: dict[int, Any] = {}  # a GPU index -> its first line
    for panel, node in zip(panels, nodes):
        for one in (s for s in found if s.node == node):
            xs = [(t - start) / 60 for t in one.times]
            ys = [v * shown.scale for v in one.values(shown.column)]  # NaN: a gap
            colour = colours(gpus.index(one.gpu) % colours.N)
            (line,) = panel.plot(xs, ys, color=colour, linewidth=1)
            legend.setdefault(one.gpu, line)
        panel.set_title(node, fontsize="small")
        panel.grid(True, alpha=0.3)
        if shown.top is not None:
            panel.set_ylim(0, shown.top)
    for panel in panels[len(nodes) :]:
        panel.set_visible(False)  # the grid's empty places
    for panel in panels[::columns]:
        panel.set_ylabel(shown.label)
    for panel in panels[len(nodes) - columns : len(nodes)]:
        panel.set_xlabel("minutes since the first sample")
        panel.xaxis.set_tick_params(labelbottom=True)
    fig.suptitle(f"run {run_id}: GPU {shown.label}")
    fig.legend([legend[g] for g in gpus], [f"GPU {g}" for g in gpus], loc="outside right upper",
               fontsize="small")  # fmt: skip
    try:
        fig.savefig(path, format="png", dpi=DPI)
    except OSError as exc:
        raise UserError("--output", f"cannot write {path}: {exc.strerror}", "", "") from None
    return True
