"""What every bench/ script shares: timing, interleaving, medians and ranges, the
PASS/MISS verdict, the markdown tables and the sections of docs/benchmarks.md.

A bench script keeps only what it measures: it hands its methods (callables, one rep
each) to `interleave`, formats their samples with `fmt`, and publishes its section with
`publish`. The scripts import it as `harness` (bench/ is on sys.path when a script in it
runs). Standard library only, like the scripts' own helpers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import pwd
import shlex
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\nMeasured figures of hpclaunch against its targets; each section is "
    "written by the harness named in it.\n"
)
NAN = float("nan")

T = TypeVar("T")


# ----------------------------------------------------------------------------- statistics
def median(xs: Sequence[float] | None) -> float:
    """The median, NaN for no samples (a method that did not run compares False)."""
    return statistics.median(xs) if xs else NAN


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    min: float
    max: float


def summary(xs: Sequence[float]) -> Summary:
    return Summary(len(xs), statistics.median(xs), min(xs), max(xs))


def fmt(xs: Sequence[float] | None, unit: str = "s", digits: int | None = None) -> str:
    """'median unit (min-max)': seconds with 3 decimals, or milliseconds ("ms", the
    samples still in seconds) with 1; "n/a" for no samples."""
    if not xs:
        return "n/a"
    s = summary(xs)
    return fmt_range(s.median, s.min, s.max, unit, digits)


def fmt_range(
    mid: float, low: float, high: float, unit: str = "s", digits: int | None = None
) -> str:
    scale = 1000.0 if unit == "ms" else 1.0
    nd = digits if digits is not None else (1 if unit == "ms" else 3)
    return f"{mid * scale:.{nd}f} {unit} ({low * scale:.{nd}f}-{high * scale:.{nd}f})"


def paired_difference(
    xs: Sequence[float], ys: Sequence[float], least: int = 5
) -> tuple[float, float, float]:
    """x - y rep by rep (interleaved reps saw the same machine): the median, and the 2nd
    smallest and 2nd largest difference, a sign-test interval for the median (87% with 7
    pairs, more with more); NaN when the series differ in length or fewer than `least`
    reps pair up."""
    if len(xs) != len(ys) or len(xs) < max(least, 3):
        return NAN, NAN, NAN
    diffs = sorted(x - y for x, y in zip(xs, ys))
    return statistics.median(diffs), diffs[1], diffs[-2]


def columns(records: Iterable[Mapping[str, float]]) -> dict[str, list[float]]:
    """Per-rep metric records -> one list of samples per metric, in rep order."""
    out: dict[str, list[float]] = {}
    for record in records:
        for key, value in record.items():
            out.setdefault(key, []).append(value)
    return out


def verdict(ok: bool, text: str, known: bool = True) -> str:
    """'PASS: text', 'MISS: text', or 'N/A: text' when the figure is unknown (`known`
    False, or a NaN in the text: a comparison with NaN is False, which is not a MISS)."""
    if ok:
        return f"PASS: {text}"
    return f"MISS: {text}" if known and "nan" not in text else f"N/A: {text}"


# ----------------------------------------------------------------------------- timing
def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """(wall seconds, result) of one call."""
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def run_timed(argv: Sequence[str], **kw: Any) -> tuple[float, subprocess.CompletedProcess[str]]:
    """(wall seconds, the finished process) of one whole process, output captured."""
    return timed(lambda: subprocess.run(argv, capture_output=True, text=True, check=False, **kw))


SAME, ALTERNATE, ROTATE = "same", "alternate", "rotate"


def order_of(names: Sequence[str], rep: int, order: str = SAME) -> list[str]:
    """The methods' order in rep `rep`: always the same; reversed every other rep; or
    turned by one each rep (for drift that favours whoever goes first or last)."""
    if order == ALTERNATE:
        return list(names) if rep % 2 == 0 else list(reversed(names))
    if order == ROTATE:
        turn = rep % len(names) if names else 0
        return [*names[turn:], *names[:turn]]
    if order != SAME:
        raise ValueError(f"order {order!r}: one of {SAME}, {ALTERNATE}, {ROTATE}")
    return list(names)


@dataclass
class Interleaved(Generic[T]):
    """What `interleave` got: per method the kept reps' results (warm-ups apart) and
    the errors of its failed reps; `skipped` reps were not started (budget)."""

    kept: dict[str, list[T]] = field(default_factory=dict)
    warm_ups: dict[str, list[T]] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)
    skipped: int = 0


def interleave(
    methods: Mapping[str, Callable[[int], T]],
    reps: int,
    *,
    warmup: int = 1,
    order: str = SAME,
    catch: tuple[type[BaseException], ...] = (Exception,),
    max_errors: int | None = None,
    budget_s: float | None = None,
    after: Callable[[str], None] | None = None,
    progress: Callable[[str, str, T], None] | None = None,
) -> Interleaved[T]:
    """Run every method once per rep, the methods in turn within a rep (drift hits them
    all alike), `warmup` discarded reps first. A method gets the rep's index (warm-ups
    included: index < warmup is a warm-up). An exception in `catch` is recorded as that
    rep's error and the rest go on; a method with `max_errors` errors is not run again;
    any other exception ends the run. `after(name)` runs after each call, also on errors
    (clean-up). No rep is started once `budget_s` would be overrun by the longest rep so
    far."""
    got: Interleaved[T] = Interleaved()
    for name in methods:
        got.kept[name], got.warm_ups[name], got.errors[name] = [], [], []
    started, longest = time.monotonic(), 0.0
    total = warmup + reps
    for rep in range(total):
        if budget_s is not None and rep and time.monotonic() - started + longest > budget_s:
            got.skipped = total - rep
            print(f"budget: {budget_s:.0f} s would be overrun; {got.skipped} rep(s) not run")
            break
        rep_started = time.monotonic()
        tag = "warm-up" if rep < warmup else f"rep {rep - warmup + 1}"
        for name in order_of(list(methods), rep, order):
            errors = got.errors[name]
            if max_errors is not None and len(errors) >= max_errors:
                continue  # this method does not work here: do not spend the machine on it
            try:
                result = methods[name](rep)
            except catch as e:
                errors.append(f"{type(e).__name__}: {e}")
                print(f"{name} {tag}: FAILED {errors[-1]}", flush=True)
                continue
            finally:
                if after is not None:
                    after(name)
            (got.warm_ups if rep < warmup else got.kept)[name].append(result)
            if progress is not None:
                progress(name, tag, result)
        longest = max(longest, time.monotonic() - rep_started)
    return got


def print_metrics(name: str, tag: str, result: Mapping[str, float] | float) -> None:
    """The usual progress line: method, rep, and its figures."""
    values = result.items() if isinstance(result, Mapping) else [("s", result)]
    print(f"{name:24s} {tag:8s} " + " ".join(f"{k}={v:.3f}" for k, v in values), flush=True)


def hyperfine_argv(
    commands: Iterable[Sequence[str]],
    runs: int,
    export: Path,
    warmup: int = 5,
    options: Sequence[str] = (),
) -> list[str]:
    """hyperfine -N over whole commands (no shell), its samples into `export`."""
    argv = ["hyperfine", "-N", "--warmup", str(warmup), "--runs", str(runs)]
    argv += ["--export-json", str(export), *options]
    return [*argv, *[shlex.join(c) for c in commands]]


def hyperfine_times(names: Iterable[str], export: Path) -> dict[str, list[float]]:
    """The seconds of each run, per command, from hyperfine's export (commands in order)."""
    results = json.loads(export.read_text())["results"]
    return {name: [float(t) for t in r["times"]] for name, r in zip(names, results)}


def start_times(
    commands: Mapping[str, Sequence[str]],
    runs: int,
    scratch: Path,
    env: Mapping[str, str] | None = None,
    warmup: int = 5,
) -> dict[str, list[float]]:
    """Wall seconds per start of each command: hyperfine -N when installed, else a
    Python loop (the same warm-ups discarded)."""
    env = dict(os.environ if env is None else env)
    if shutil.which("hyperfine"):
        export = scratch / "hyperfine.json"
        hyper = hyperfine_argv(commands.values(), runs, export, warmup)
        done = subprocess.run(hyper, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"hyperfine exited {done.returncode}: {done.stderr[-500:]}")
        return hyperfine_times(commands, export)
    out: dict[str, list[float]] = {}
    for name, argv in commands.items():
        out[name] = []
        for i in range(runs + warmup):
            took, _ = run_timed(argv, env=env)
            if i >= warmup:
                out[name].append(took)
    return out


# ----------------------------------------------------------------------------- facts
def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def first_line(argv: Sequence[str]) -> str:
    """A tool's first line of output (its version), or "unavailable"."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return (done.stdout + done.stderr).strip().splitlines()[0]
    except (OSError, IndexError):
        return "unavailable"


def module_version(name: str) -> str:
    try:
        return str(__import__(name).__version__)
    except Exception as e:  # a missing tool is a fact too
        return f"unavailable ({type(e).__name__})"


def machine_facts(
    *, slurm: bool = False, interpreter: str = "", user: bool = False
) -> dict[str, str]:
    """The facts line's usual entries: date, nproc, load, kernel, [slurm], python
    [(interpreter)], [user]; a script adds its own."""
    python = platform.python_version() + (f" ({interpreter})" if interpreter else "")
    facts = {
        "date": utc_now(),
        "nproc": str(os.cpu_count()),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "kernel": platform.release(),
    }
    if slurm:
        facts["slurm"] = first_line(["sinfo", "--version"])
    facts["python"] = python
    if user:
        facts["user"] = pwd.getpwuid(os.getuid()).pw_name
    return facts


def facts_line(
    facts: Mapping[str, str], skip: Iterable[str] = ("date", "user"), sep: str = ", "
) -> str:
    left_out = set(skip)
    return sep.join(f"{k} {v}" for k, v in facts.items() if k not in left_out)


# ----------------------------------------------------------------------------- markdown
def table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table; a `|` inside a cell is written `/`, an empty cell `| |`."""

    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {c.replace('|', '/')} " if c else " " for c in cells) + "|"

    return [line(head), "|" + "---|" * len(head), *(line(r) for r in rows)]


def reproduce(*commands: str) -> list[str]:
    return ["Reproduce:", "", "```bash", *commands, "```"]


def markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


def section(name: str, title: str, lines: Iterable[str]) -> str:
    """A script's whole section: its markers, its `## title`, a blank line, its lines."""
    start, end = markers(name)
    return "\n".join([start, f"## {title}", "", *lines, end])


def write_section(doc: Path, name: str, text: str) -> None:
    """Replace the section between `name`'s markers in `doc` (or append it), so each
    script rewrites only what it measured; the rest of the file stays byte for byte."""
    start, end = markers(name)
    old = doc.read_text() if doc.exists() else HEADER
    if start in old and end in old[old.index(start) :]:
        before, rest = old.split(start, 1)
        new = before + text + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(new)


# ----------------------------------------------------------------------------- a script's run
def arguments(description: str, reps: int, quick_reps: int = 1) -> argparse.ArgumentParser:
    """The options every script takes; the environment's REPS, NO_DOC=1 and
    RENDER_ONLY=1 still work. --quick: the fewest reps that still run every part (a
    check that the script works, not figures to publish)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--reps", type=int, default=int(os.environ.get("REPS", str(reps))))
    p.add_argument(
        "--quick", action="store_true", help=f"{quick_reps} rep(s), smallest inputs: a check"
    )
    p.add_argument(
        "--no-doc",
        action="store_true",
        default=os.environ.get("NO_DOC") == "1",
        help="print the section only",
    )
    p.add_argument("--doc", type=Path, default=DOC, help="the file the section goes into")
    p.add_argument(
        "--render-only",
        action="store_true",
        default=os.environ.get("RENDER_ONLY") == "1",
        help="re-render from the last run's saved results",
    )
    p.set_defaults(quick_reps=quick_reps)
    return p


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = p.parse_args(argv)
    if args.quick:
        args.reps = min(args.reps, args.quick_reps)
    return args


def results(
    args: argparse.Namespace, saved: Path, measure: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """The run's data: measured (and saved as JSON) or, with --render-only, read back."""
    if args.render_only:
        data: dict[str, Any] = json.loads(saved.read_text())
        return data
    data = measure()
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(data, indent=1))
    return data


def publish(args: argparse.Namespace, name: str, text: str) -> None:
    """Print the section and, unless --no-doc, write it into --doc."""
    print(text)
    if not args.no_doc:
        write_section(args.doc, name, text)
        print(f"wrote {args.doc}")


def fresh(path: Path) -> Path:
    """An empty folder at `path` (what was there is removed)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
