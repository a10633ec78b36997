"""`hpclaunch sweep plot`: a metric of a sweep's points against one parameter.

Data: only COMPLETED points whose result.json holds a finite number under the metric
count. Points are grouped into series by the value of `--by` (one series without it);
points of a series with the same x (repeats over `seed`, or any parameter not named)
become one plotted point: their mean, SAMPLE standard deviation (n-1; 0 when n == 1),
n, min and max. X values are numeric when every one parses as a finite float (sorted,
equal numbers merged), else categories in first-seen order. The history view (Optuna's
default) is the metric per completed point in point order and the running best.

Rendering: the same numbers as CSV (`--data`), an aligned text table, or a PNG of exactly
the requested pixels through matplotlib's Agg canvas. matplotlib is an optional extra
(`hpclaunch[plot]`), imported only here and only when a PNG is asked for.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hpclaunch.basics.states import State
from hpclaunch.errors import UserError, show
from hpclaunch.observe.figure import DPI, HINT, parse_size

CSV_COLUMNS = ("series", "x", "mean", "std", "n", "min", "max")


@dataclass(frozen=True)
class Stat:
    """One plotted point: the points of a series that share an x value."""

    label: str  # x as shown (first-seen text of the value)
    xv: Optional[float]  # x as a number; None on a categorical axis
    mean: float
    std: float  # sample standard deviation (n-1), 0.0 when n == 1
    n: int
    lo: float
    hi: float


@dataclass(frozen=True)
class Series:
    name: str
    stats: list[Stat]


@dataclass(frozen=True)
class Plot:
    sweep_id: str
    metric: str
    x: str  # the parameter on the x axis ("point" for the history)
    by: Optional[str]
    series: list[Series]
    history: bool = False
    direction: str = "minimize"
    categories: list[str] = field(default_factory=list)  # a categorical axis, in order


def _number(value: Any) -> Optional[float]:
    """A finite float, or None; booleans are categories, not 0/1."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _metric(row: Mapping[str, Any], metric: str) -> Optional[float]:
    value = (row.get("result") or {}).get(metric)
    return None if isinstance(value, str) else _number(value)


def usable(
    rows: Sequence[Mapping[str, Any]], metric: str, needs: Sequence[str] = ()
) -> tuple[list[Any], list[str]]:
    """The rows that count and, for the one stderr line, why the others do not."""
    kept: list[Any] = []
    left: dict[str, int] = {}
    for row in rows:
        lacks = [n for n in needs if n not in (row.get("params") or {})]
        if row.get("state") != State.COMPLETED:
            why = str(row.get("state"))
        elif _metric(row, metric) is None:
            why = f"without a finite number {metric} in result.json"
        elif lacks:
            why = f"without parameter {lacks[0]}"
        else:
            kept.append(row)
            continue
        left[why] = left.get(why, 0) + 1
    return kept, [f"{n} {why}" for why, n in sorted(left.items())]


def param_names(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row.get("params") or {}))
    return list(names)


def _check_param(option: str, name: Optional[str], names: Sequence[str]) -> None:
    if name is not None and name not in names:
        listed = ", ".join(names) if names else "none: its points have no named parameters"
        raise UserError(
            option,
            f"{show(name)} is no parameter of the sweep",
            f"its parameters: {listed}",
            "Give one of them (or --history for the metric per point)",
        )


def _stat(label: str, xv: Optional[float], values: Sequence[float]) -> Stat:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return Stat(label, xv, statistics.fmean(values), std, len(values), min(values), max(values))


def _key(value: Any, numeric: bool) -> Any:
    return _number(value) if numeric else str(value)


def series(
    sweep_id: str, rows: Sequence[Mapping[str, Any]], metric: str, x: str, by: Optional[str]
) -> Plot:
    """The plotted series from rows that count and have x and by (see usable())."""
    xs = [r["params"][x] for r in rows]
    numeric = all(_number(v) is not None for v in xs)
    groups: dict[str, dict[Any, list[Any]]] = {}
    for row in rows:
        name = metric if by is None else f"{by}={row['params'][by]}"
        groups.setdefault(name, {}).setdefault(_key(row["params"][x], numeric), []).append(row)
    # Numeric x: sorted; categories keep the order the sweep ran them in, on every series.
    order = sorted({_key(v, True) for v in xs}) if numeric else list(dict.fromkeys(map(str, xs)))
    out = []
    for name, by_x in groups.items():
        stats = []
        for key in order:
            if key in by_x:
                label = str(by_x[key][0]["params"][x])
                values = [float(_metric(r, metric) or 0.0) for r in by_x[key]]
                stats.append(_stat(label, float(key) if numeric else None, values))
        out.append(Series(name, stats))
    if by is not None and all(_number(n.split("=", 1)[1]) is not None for n in groups):
        out.sort(key=lambda s: _number(s.name.split("=", 1)[1]) or 0.0)
    return Plot(sweep_id, metric, x, by, out, categories=[] if numeric else list(order))


def history(sweep_id: str, rows: Sequence[Mapping[str, Any]], metric: str, direction: str) -> Plot:
    """The metric of each counted point in point order and the best so far."""
    pick = max if direction == "maximize" else min
    values: list[Stat] = []
    best: list[Stat] = []
    for row in sorted(rows, key=lambda r: int(r["index"])):
        value = float(_metric(row, metric) or 0.0)
        label = str(row["index"])
        values.append(Stat(label, float(row["index"]), value, 0.0, 1, value, value))
        top = value if not best else pick(best[-1].mean, value)
        best.append(Stat(label, float(row["index"]), top, 0.0, 1, top, top))
    shown = [Series(metric, values), Series(f"best ({direction})", best)]
    return Plot(sweep_id, metric, "point", None, shown, history=True, direction=direction)


def number_text(value: float) -> str:
    """A number as the CSV holds it: shortest text that reads back as the same float."""
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def csv_rows(plot: Plot) -> list[list[str]]:
    return [
        [s.name, number_text(t.xv) if t.xv is not None else t.label, repr(t.mean), repr(t.std),
         str(t.n), repr(t.lo), repr(t.hi)]
        for s in plot.series
        for t in s.stats
    ]  # fmt: skip


def write_data(plot: Plot, path: Path) -> None:
    try:
        with open(path, "w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(CSV_COLUMNS)
            writer.writerows(csv_rows(plot))
    except OSError as exc:
        raise UserError("--data", f"cannot write {path}: {exc.strerror}", "", "") from None


def _g(value: float) -> str:
    return f"{value:.6g}"


def _aligned(head: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *body]]


def text(plot: Plot) -> str:
    """The plotted numbers as an aligned table with a title line."""
    if plot.history:
        values, best = plot.series
        title = f"sweep {plot.sweep_id}: {plot.metric} per point and best so far ({plot.direction})"
        head = ["POINT", plot.metric.upper(), "BEST"]
        body = [[v.label, _g(v.mean), _g(b.mean)] for v, b in zip(values.stats, best.stats)]
    else:
        per = f", one series per {plot.by}" if plot.by else ""
        title = (
            f"sweep {plot.sweep_id}: {plot.metric} against {plot.x}{per} "
            "(mean and sample std over the points at each x)"
        )
        head = ["SERIES", plot.x.upper(), "MEAN", "STD", "N", "MIN", "MAX"]
        body = [
            [s.name, t.label, _g(t.mean), _g(t.std), str(t.n), _g(t.lo), _g(t.hi)]
            for s in plot.series
            for t in s.stats
        ]
    return "\n".join([title, *_aligned(head, body)]) + "\n"


def _xs(plot: Plot, line: Series) -> list[float]:
    """Where a series' points lie: the number, or a category's place on the axis."""
    where = {c: float(i) for i, c in enumerate(plot.categories)}
    return [t.xv if t.xv is not None else where[t.label] for t in line.stats]


def png(plot: Plot, path: Path, size: tuple[int, int], logx: bool) -> bool:
    """Draw the plot into a PNG of exactly `size` pixels; False when matplotlib is absent.

    Figure + FigureCanvasAgg instead of pyplot: Agg needs no display (jobs, CI), and
    neither the global backend nor pyplot's figure registry is touched.
    """
    try:
        import matplotlib  # noqa: F401  (first: a blocked matplotlib fails here)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    fig = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if plot.history:
        values, best = plot.series
        ax.plot(_xs(plot, values), [t.mean for t in values.stats], "o", label="trial")
        ax.step(_xs(plot, best), [t.mean for t in best.stats], where="post", label=best.name)
        ax.set_xlabel("point (trial)")
        ax.set_title(f"sweep {plot.sweep_id}: optimisation history")
    else:
        for s in plot.series:
            ax.errorbar(_xs(plot, s), [t.mean for t in s.stats], yerr=[t.std for t in s.stats],
                        marker="o", capsize=3, label=s.name)  # fmt: skip
        if plot.categories:
            ax.set_xticks(range(len(plot.categories)), plot.categories)
        ax.set_xlabel(plot.x)
        ax.set_title(f"sweep {plot.sweep_id}: {plot.metric} (mean ± sample std)")
    if logx:
        ax.set_xscale("log")
    ax.set_ylabel(plot.metric)
    ax.grid(True, alpha=0.3)
    if len(plot.series) > 1:
        ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=DPI)
    except OSError as exc:
        raise UserError("--output", f"cannot write {path}: {exc.strerror}", "", "") from None
    return True


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


@dataclass(frozen=True)
class PlotRequest:
    """What `hpclaunch sweep plot` was asked for."""

    x: Optional[str] = None
    metric: Optional[str] = None
    by: Optional[str] = None
    output: Optional[str] = None
    data: Optional[str] = None
    size: Optional[str] = None
    logx: bool = False
    history: bool = False
    text: bool = False
    direction: Optional[str] = None


def _result_keys(rows: Sequence[Mapping[str, Any]]) -> str:
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row.get("result") or {}))
    return ", ".join(keys) or "none: no point has a result yet"


def _build(data: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], req: PlotRequest) -> Plot:
    """Check the request against the sweep and compute what is plotted."""
    options = data.get("sweep") or {}
    optuna = data.get("kind") == "optuna"
    metric = req.metric or options.get("metric")
    if not metric:
        raise UserError(
            "--metric", "missing", f"result keys: {_result_keys(rows)}", "Give --metric NAME"
        )
    as_history = req.history or (optuna and req.x is None)
    if as_history and (req.x is not None or req.by is not None or req.logx):
        raise UserError("--history", "plots the metric per point", "no --x, --by or --logx", "")
    names = param_names(rows)
    if not as_history and req.x is None:
        listed = ", ".join(names) or "none"
        raise UserError("--x", "missing", f"the sweep's parameters: {listed}", "Give --x NAME")
    _check_param("--x", req.x, names)
    _check_param("--by", req.by, names)
    if req.by is not None and req.by == req.x:
        raise UserError("--by", f"{show(req.by)} is also --x", "", "Name another parameter")
    kept, why = usable(rows, metric, [n for n in (req.x, req.by) if n is not None])
    if not kept:
        raise UserError(
            "--metric",
            f"no completed point has a finite number {show(metric)} in its result",
            f"{len(rows)} points: " + ", ".join(why) + f"; result keys: {_result_keys(rows)}",
            "Wait for the sweep (hpclaunch sweep wait) or name another metric",
        )
    if why:
        print(f"hpclaunch: plot: {len(rows) - len(kept)} of {len(rows)} points left out: "
              + ", ".join(why), file=sys.stderr)  # fmt: skip
    sweep_id = str(data.get("sweep_id"))
    if as_history:
        direction = req.direction or options.get("direction") or "minimize"
        return history(sweep_id, kept, metric, direction)
    assert req.x is not None
    plot = series(sweep_id, kept, metric, req.x, req.by)
    if req.logx and any(t.xv is None or t.xv <= 0 for s in plot.series for t in s.stats):
        raise UserError("--logx", f"{req.x} has values that are not positive numbers", "", "")
    return plot


def run(
    folder: Path,
    data: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    req: PlotRequest,
    as_json: bool = False,
) -> int:
    """Everything after finding the sweep: refuse, compute, write CSV, table or PNG
    (--json: one object with the series and the PNG's path, null when none)."""
    size = parse_size(req.size)
    if req.text and req.output:
        raise UserError("--text", "prints a table instead of a PNG", "", "Drop -o or --text")
    plot = _build(data, rows, req)
    if req.data:
        write_data(plot, Path(req.data))
    if req.text:
        sys.stdout.write(_as_json(plot, None) if as_json else text(plot))
        return 0
    name = f"plot-{_safe(plot.metric)}-{'history' if plot.history else _safe(plot.x)}.png"
    path = Path(req.output) if req.output else folder / name
    written = png(plot, path, size, req.logx)
    if as_json:
        sys.stdout.write(_as_json(plot, path if written else None))
        if not written:
            print(HINT, file=sys.stderr)
        return 1 if req.output and not written else 0
    if not written:
        sys.stdout.write(text(plot))
        if req.output:  # a file was asked for and none is written: not a success
            print(f"hpclaunch: error: -o: {path} not written: a PNG needs matplotlib. "
                  "pip install 'hpclaunch[plot]'", file=sys.stderr)  # fmt: skip
            return 1
        print(HINT, file=sys.stderr)
        return 0
    print(path)
    return 0


def _as_json(plot: Plot, png_path: Optional[Path]) -> str:
    """`sweep plot --json`: the plotted numbers and where the PNG went, one line."""
    import json
    from dataclasses import asdict

    return json.dumps({**asdict(plot), "png": str(png_path) if png_path else None}) + "\n"
