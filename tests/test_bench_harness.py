"""bench/harness.py, the bench scripts' one harness: statistics, the interleaving
order, the verdict, the markdown table and the replacement of a named section of
docs/benchmarks.md. Unit tests; no testbed."""

from __future__ import annotations

import ast
import math
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import harness  # noqa: E402


def test_median_and_range_formatting() -> None:
    xs = [0.3, 0.1, 0.2, 0.5]
    s = harness.summary(xs)
    assert (s.n, s.median, s.min, s.max) == (4, pytest.approx(0.25), 0.1, 0.5)
    assert harness.fmt(xs) == "0.250 s (0.100-0.500)"
    assert harness.fmt([0.0123, 0.0101, 0.0150], "ms") == "12.3 ms (10.1-15.0)"
    assert harness.fmt([0.0123, 0.0101, 0.0150], "ms", digits=0) == "12 ms (10-15)"
    assert harness.fmt([]) == harness.fmt(None) == "n/a"
    assert harness.median([3.0, 1.0, 2.0]) == 2.0
    assert math.isnan(harness.median([])) and math.isnan(harness.median(None))


def test_paired_difference_is_the_median_and_a_sign_test_interval() -> None:
    xs = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0]
    ys = [9.0, 9.5, 12.5, 12.0, 11.0, 15.0, 10.0]  # differences 1 1.5 -0.5 1 3 0 6
    mid, low, high = harness.paired_difference(xs, ys)
    assert (mid, low, high) == (1.0, 0.0, 3.0)  # sorted: -0.5 0 1 1 1.5 3 6
    assert all(math.isnan(v) for v in harness.paired_difference(xs[:4], ys[:4]))
    assert all(math.isnan(v) for v in harness.paired_difference(xs, ys[:6]))


def test_columns_turn_rep_records_into_samples_per_metric() -> None:
    reps = [{"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 4.0}]
    assert harness.columns(reps) == {"a": [1.0, 3.0], "b": [2.0, 4.0]}


def test_verdict_says_na_for_what_was_not_measured() -> None:
    assert harness.verdict(True, "x 1 s") == "PASS: x 1 s"
    assert harness.verdict(False, "x 2 s") == "MISS: x 2 s"
    assert harness.verdict(False, "x nan s") == "N/A: x nan s"
    assert harness.verdict(False, "x", known=False) == "N/A: x"


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        (harness.SAME, ["abc", "abc", "abc", "abc"]),
        (harness.ALTERNATE, ["abc", "cba", "abc", "cba"]),
        (harness.ROTATE, ["abc", "bca", "cab", "abc"]),
    ],
)
def test_interleave_runs_every_method_once_per_rep_in_the_asked_order(
    order: str, expected: list[str]
) -> None:
    calls: list[tuple[str, int]] = []

    def method(name: str):  # type: ignore[no-untyped-def]
        def rep(i: int) -> float:
            calls.append((name, i))
            return float(i)

        return rep

    got = harness.interleave({n: method(n) for n in "abc"}, 3, order=order)
    per_rep = ["".join(n for n, i in calls if i == rep) for rep in range(4)]
    assert per_rep == expected
    assert got.warm_ups == {"a": [0.0], "b": [0.0], "c": [0.0]}  # rep 0 is discarded
    assert got.kept == {"a": [1.0, 2.0, 3.0], "b": [1.0, 2.0, 3.0], "c": [1.0, 2.0, 3.0]}


def test_interleave_records_errors_drops_a_failing_method_and_always_cleans_up() -> None:
    cleaned: list[str] = []

    def broken(rep: int) -> float:
        raise RuntimeError(f"down in {rep}")

    got = harness.interleave(
        {"ok": lambda rep: 1.0, "broken": broken},
        4,
        warmup=0,
        max_errors=2,
        after=cleaned.append,
    )
    assert got.kept == {"ok": [1.0] * 4, "broken": []}
    assert got.errors["broken"] == ["RuntimeError: down in 0", "RuntimeError: down in 1"]
    assert cleaned == ["ok", "broken", "ok", "broken", "ok", "ok"]


def test_interleave_lets_an_uncaught_error_end_the_run() -> None:
    def broken(rep: int) -> float:
        raise KeyError(rep)

    with pytest.raises(KeyError):
        harness.interleave({"broken": broken}, 2, catch=(RuntimeError,))


def test_interleave_starts_no_rep_past_the_budget() -> None:
    got = harness.interleave({"a": lambda rep: 0.0}, 5, warmup=0, budget_s=-1.0)
    assert got.kept == {"a": [0.0]} and got.skipped == 4


def test_table_writes_markdown_rows_and_escapes_bars() -> None:
    assert harness.table(["what", "time", "n"], [["a|b", "1 s", "3"], ["floor", "", "1"]]) == [
        "| what | time | n |",
        "|---|---|---|",
        "| a/b | 1 s | 3 |",
        "| floor | | 1 |",
    ]


def test_write_section_replaces_only_its_own_section(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    harness.write_section(doc, "one", harness.section("one", "First", ["old"]))
    harness.write_section(doc, "two", harness.section("two", "Second", ["kept"]))
    assert doc.read_text().startswith(harness.HEADER)
    harness.write_section(doc, "one", harness.section("one", "First", ["new", "lines"]))
    text = doc.read_text()
    assert "old" not in text and "new\nlines" in text and "kept" in text
    assert text.index("bench:one:start") < text.index("bench:two:start")  # stays in place
    assert text.count("<!-- bench:one:start -->") == 1
    assert "<!-- bench:one:start -->\n## First\n\nnew\nlines\n<!-- bench:one:end -->" in text


def test_write_section_leaves_the_rest_of_the_file_byte_for_byte(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    start, end = harness.markers("x")
    doc.write_text(f"# B\n\nintro  \n\n{start}\nold\n{end}\n\ntail\n")
    harness.write_section(doc, "x", f"{start}\nnew\n{end}")
    assert doc.read_text() == f"# B\n\nintro  \n\n{start}\nnew\n{end}\n\ntail\n"


def test_quick_caps_the_reps_and_the_doc_can_be_elsewhere(tmp_path: Path) -> None:
    p = harness.arguments("x", reps=7, quick_reps=2)
    args = harness.parse(p, ["--quick", "--doc", str(tmp_path / "b.md")])
    assert args.reps == 2 and args.doc == tmp_path / "b.md" and not args.no_doc
    assert harness.parse(p, []).reps == int(os.environ.get("REPS", "7"))


def test_start_times_times_every_command(tmp_path: Path) -> None:
    times = harness.start_times({"true": ["true"]}, 3, tmp_path, warmup=1)
    assert list(times) == ["true"] and len(times["true"]) == 3
    assert all(0 < t < 5 for t in times["true"])


# What each script used to define for itself and now takes from the harness.
SHARED = {"fmt", "med", "summary", "fresh", "write_section", "write_doc", "timed", "sh"}
SHARED |= {"paired_difference", "first_line", "tool_version"}


@pytest.mark.parametrize(
    "script",
    sorted(p.name for p in BENCH.glob("*.py") if p.name not in ("harness.py", "cluster.py")),
)
def test_no_bench_script_redefines_the_harness(script: str) -> None:
    tree = ast.parse((BENCH / script).read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    imported = {
        a.name.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not defined & SHARED, f"{script} defines {sorted(defined & SHARED)}: use harness"
    assert "statistics" not in imported and "benchdoc" not in imported
    assigned = {
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    assert not assigned & {"DOC", "MARK_START", "HEADER"}, "the doc and its markers: harness"
