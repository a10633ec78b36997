"""The added cost of `hpclaunch.call` (a harness, not a test).

Times, in this process through the Python API, a call of a trivial function against
`hpclaunch.run` of a trivial program (`python -I -c pass`, the same interpreter) waited
for, each from the request to the answer in hand (the call's results, the run's exit
code), the two interleaved in every rep (one warm-up rep discarded):

  local    1 node x 1 rank, cluster="local"
  testbed  2 nodes x 2 ranks on the Slurm testbed (with --testbed; SLURM_CONF set)

The call's added cost is the paired difference call - run, rep by rep: its median and
a sign-test interval (bench/harness.py), to the last rank's end (the bootstrap's events)
and to the answer in hand. Target: at most 50 ms (issue 35), to the last rank's end. Both sides
write a run folder, a record and an index entry and start the same interpreter per rank;
the call adds the pickled payload and cloudpickle's copy written into the run folder,
cloudpickle's import and the unpickling in each rank, and reading the results back.

    .venv/bin/python bench/call.py --reps 15 [--testbed] [--quick] [--no-doc]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import harness as h  # bench/ is on sys.path when run as a script

import hpclaunch

SCRATCH = Path(os.environ.get("BENCH_SCRATCH", "/var/tmp/hpclaunch-bench")) / "call"
SAVED = Path(__file__).resolve().parent / "results" / "call.json"
TARGET_MS = 50.0
SHAPES = {
    "local": {"cluster": "local", "nodes": 1, "tasks_per_node": 1},
    "testbed": {"cluster": "slurm", "nodes": 2, "tasks_per_node": 2},
}


def trivial() -> int:
    return 0


def last_rank_end(run_dir: Path) -> float:
    """The wall-clock time the last rank's program ended (the bootstrap's events)."""
    ends = [
        event["time"]
        for event in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
        if event.get("event") == "rank_end"
    ]
    return float(max(ends))


def methods(
    shape: dict[str, Any], environ: dict[str, str]
) -> dict[str, Callable[[int], dict[str, float]]]:
    options = {**shape, "no_snapshot": True, "cwd": str(SCRATCH), "environ": environ}
    run_options = {k: v for k, v in options.items() if k != "environ"}
    world = shape["nodes"] * shape["tasks_per_node"]

    def call(_rep: int) -> dict[str, float]:
        t0 = time.time()
        submitted = hpclaunch.submit(trivial, options=options)
        results = submitted.result()
        seconds = time.time() - t0
        assert list(results) == [0] * world, results
        return {"s": seconds, "end_s": last_rank_end(submitted.run.run_dir) - t0}

    def run(_rep: int) -> dict[str, float]:
        t0 = time.time()
        started = hpclaunch.run(
            [sys.executable, "-I", "-c", "pass"], environ=environ, **run_options
        )
        code = started.wait()
        seconds = time.time() - t0
        assert code == 0, code
        return {"s": seconds, "end_s": last_rank_end(Path(started.run_dir)) - t0}

    return {"run": run, "call": call}


def measure(reps: int, shapes: list[str]) -> dict[str, Any]:
    h.fresh(SCRATCH)
    environ = {**os.environ, "XDG_DATA_HOME": str(SCRATCH / "xdg")}
    data: dict[str, Any] = {"reps": reps, "facts": h.machine_facts(slurm="testbed" in shapes)}
    for name in shapes:
        got = h.interleave(
            methods(SHAPES[name], environ), reps, order=h.ALTERNATE, progress=h.print_metrics
        )
        data[name] = {"kept": got.kept, "errors": got.errors}
    return data


def render(data: dict[str, Any]) -> list[str]:
    rows, verdicts = [], []
    for name in ("local", "testbed"):
        if name not in data:
            continue
        kept = {m: h.columns(r) for m, r in data[name]["kept"].items()}
        shape = SHAPES[name]
        added = {}
        for col in ("s", "end_s"):
            mid, low, high = h.paired_difference(kept["call"][col], kept["run"][col], least=3)
            added[col] = (mid, h.fmt_range(mid, low, high, "ms"))
        rows.append(
            [
                f"{name} {shape['nodes']}x{shape['tasks_per_node']}",
                h.fmt(kept["run"]["end_s"]),
                h.fmt(kept["call"]["end_s"]),
                added["end_s"][1],
                h.fmt(kept["run"]["s"]),
                h.fmt(kept["call"]["s"]),
                added["s"][1],
                str(len(kept["call"]["s"])),
            ]
        )
        for col, what in (("end_s", "to the last rank's end"), ("s", "to the answer")):
            mid, text = added[col]
            verdicts.append(
                h.verdict(mid * 1000 <= TARGET_MS, f"{name}, {what}: call adds {text} (<= 50 ms)")
            )
        for method, errors in data[name]["errors"].items():
            verdicts += [f"{name} {method} failed: {e}" for e in errors]
    head = [
        "shape",
        "run: to last rank end",
        "call: to last rank end",
        "added",
        "run: to answer",
        "call: to answer",
        "added",
        "n",
    ]
    return [*h.table(head, rows), "", *[f"- {v}" for v in verdicts]]


def doc_section(body: list[str], data: dict[str, Any]) -> str:
    return h.section(
        "call",
        "The added cost of `hpclaunch.call` (`bench/call.py`)",
        [
            f"Measured {data['facts']['date']}; {h.facts_line(data['facts'])}. Median "
            "(min-max) over n reps, the two methods interleaved (alternating order) in "
            "each rep, in one Python process; the added cost is the paired difference with "
            'a sign-test interval. "To last rank end": from the request to the end of the '
            "last rank's program (the bootstrap's rank_end event), what a call itself adds; "
            '"to answer": until the results (the exit code) are in hand, which adds the '
            "wait loop's polling grain (a Slurm job is asked about every second or more, "
            "observe/waiting.py), so a rank ending a few ms later can cost a whole poll.",
            "",
            *body,
            "",
            *h.reproduce(f".venv/bin/python bench/call.py --reps {data['reps']} [--testbed]"),
        ],
    )


def main() -> int:
    parser = h.arguments(__doc__.splitlines()[0], reps=15, quick_reps=2)
    parser.add_argument("--testbed", action="store_true", help="also 2x2 on the Slurm testbed")
    args = h.parse(parser)
    shapes = ["local", "testbed"] if args.testbed else ["local"]
    data = h.results(args, SAVED, lambda: measure(args.reps, shapes))
    h.publish(args, "call", doc_section(render(data), data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
