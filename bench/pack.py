"""64 sleeping points of 1-10 s on the testbed's 2 nodes x 2 GPUs, side by side in one
run (a harness, not a test; issue 30):

  packed   `hpclaunch sweep --pack -N 2 --gpus-per-node 2 --configs durations.txt --wait`
           (4 one-GPU slots, one sbatch, one srun step per node)
  array    `hpclaunch sweep --gpus-per-node 1 --max-parallel 4 --configs ... --wait`
           (one array task per point, at most 4 at once)

For each: the makespan (sbatch to the last point's end, from the points' own events)
against the ideal (the points' total sleep / 4 slots), and the scheduler RPCs it cost
(sdiag's REQUEST_SUBMIT_BATCH_JOB, REQUEST_JOB_STEP_CREATE and all RPCs, reset before
each method: run it as root, the testbed's SlurmUser, on an otherwise idle testbed).
Goal: packed within 1.15x of ideal, and at least 10x fewer step and submit RPCs than the
array (issue 30's measure; the all-RPC column adds the status polling both share).

    export SLURM_CONF=/var/tmp/hpclaunch-testbed/slurm.conf
    .venv/bin/python bench/pack.py [--reps N] [--quick] [--no-doc]
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import cluster
import harness as h

BENCH = Path(__file__).resolve().parent
SCRATCH = Path(os.environ.get("BENCH_SCRATCH", "/var/tmp/hpclaunch-bench")) / "pack"
POINTS, SLOTS = 64, 4
METHODS = ("packed", "array")


def durations() -> list[int]:
    rng = random.Random(30)  # the same 64 durations every run
    return [rng.randint(1, 10) for _ in range(POINTS)]


def rpc_counts() -> dict[str, int]:
    out = cluster.sh(["sdiag"])
    counts = {
        m[1]: int(m[2]) for m in re.finditer(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)", out, re.M)
    }
    # the per-type table lists each RPC type once; the per-user table repeats the total
    return counts


def point_times(sweep_dir: Path) -> tuple[float, float]:
    """The first point's start and the last point's end (the points' own events)."""
    starts, ends = [], []
    for events in sweep_dir.glob("points/*/events.jsonl"):
        for line in events.read_text().splitlines():
            event = json.loads(line)
            if event["event"] == "point_start":
                starts.append(float(event["time"]))
            elif event["event"] == "point_end":
                ends.append(float(event["time"]))
    return min(starts), max(ends)


def run_method(method: str, configs: Path, env: dict[str, str]) -> dict[str, float]:
    cluster.wait_idle(timeout=300)
    subprocess.run(["sdiag", "--reset"], check=True, capture_output=True)
    shape = ["--pack", "-N", "2", "--gpus-per-node", "2"] if method == "packed" else [
        "--gpus-per-node", "1", "--max-parallel", str(SLOTS)]  # fmt: skip
    argv = [str(cluster.BINDIR / "hpclaunch"), "sweep", "--cluster", "slurm", "--json",
            "--no-snapshot", "--run-root", str(SCRATCH / "runs"), *shape, "--configs",
            str(configs), "--wait", "--", "sleep"]  # fmt: skip
    t0 = time.time()
    done = subprocess.run(argv, env=env, cwd=SCRATCH, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{method}: {done.stderr.strip()[-500:]}")
    rpcs = rpc_counts()
    load = os.getloadavg()[0]  # how busy the machine was: its CPUs run both nodes
    others = cluster.sh(["squeue", "-h", "-o", "%u"]).split()  # other users' jobs beside
    sweep_dir = Path(json.loads(done.stdout.splitlines()[0])["sweep_dir"])
    first, last = point_times(sweep_dir)
    return {
        "makespan": last - t0,
        "running": last - first,
        "submit_rpcs": float(rpcs.get("REQUEST_SUBMIT_BATCH_JOB", 0)),
        "step_rpcs": float(rpcs.get("REQUEST_JOB_STEP_CREATE", 0)),
        "all_rpcs": float(sum(v for k, v in rpcs.items() if k.startswith("REQUEST_"))),
        "load_after": load,
        "jobs_beside": float(len(others)),
    }


def measure(reps: int) -> dict[str, Any]:
    cluster.ensure_cluster()
    h.fresh(SCRATCH)
    configs = SCRATCH / "durations.txt"
    configs.write_text("".join(f"{d}\n" for d in durations()))
    env = {**os.environ, "XDG_DATA_HOME": str(SCRATCH / "xdg")}
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID"):
        env.pop(var, None)
    reps_data: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    for rep in range(reps):
        for method in h.order_of(METHODS, rep, h.ALTERNATE):
            reps_data[method].append(run_method(method, configs, env))
    return {"facts": h.machine_facts(), "reps": reps_data, "ideal": sum(durations()) / SLOTS}


def _count(xs: list[float]) -> str:
    return f"{h.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"


def _load(method: str, c: dict[str, list[float]]) -> str:
    """The 1-minute load average as each method ended, and the jobs in the queue then
    (the testbed is shared with other work; its 2 CPUs run both nodes)."""
    if "load_after" not in c:
        return f"{method}: not recorded"
    loads = ", ".join(f"{x:.2f}" for x in c["load_after"])
    return f"{method}: 1-min load {loads} at its end, {max(c['jobs_beside']):.0f} jobs in the queue"


def _shared_note(cols: dict[str, dict[str, list[float]]]) -> list[str]:
    """Each method submits one sbatch: more submissions in its window were other clients',
    and so were part of its other RPCs (sdiag counts the whole controller's)."""
    most = max(max(cols[m]["submit_rpcs"]) for m in METHODS)
    if most <= 1:
        return []
    return [
        f"Not alone: up to {most:.0f} batch submissions were counted in a method's window, "
        "where each method makes one: other users' jobs ran on the testbed meanwhile, and "
        "their RPCs are in every column above (an upper bound for both methods, the ratio "
        "not the methods' own). Rerun on an idle testbed for the RPC goal.",
        "",
    ]


def render(data: dict[str, Any]) -> str:
    ideal = float(data["ideal"])
    cols = {m: h.columns(data["reps"][m]) for m in METHODS}
    rows = []
    for method in METHODS:
        c = cols[method]
        ratio = [x / ideal for x in c["makespan"]]
        rows.append([method, h.fmt(c["makespan"]), f"{h.median(ratio):.2f}x",
                     h.fmt(c["running"]), _count(c["submit_rpcs"]),
                     _count(c["step_rpcs"]), _count(c["all_rpcs"]),
                     str(len(c["makespan"]))])  # fmt: skip
    packed_ratio = h.median(cols["packed"]["makespan"]) / ideal
    # The measure: each method's step and submit RPCs (what grows with the points);
    # "all RPCs" adds the status polling both methods share and any other client's calls.
    own = {
        m: [a + b for a, b in zip(cols[m]["submit_rpcs"], cols[m]["step_rpcs"])] for m in METHODS
    }
    fewer = h.median(own["array"]) / max(1.0, h.median(own["packed"]))
    lines = [
        f"Measured {h.utc_now()}; {h.facts_line(data['facts'])}. {POINTS} points sleeping "
        f"1-10 s (seeded), total {ideal * SLOTS:.0f} s of work on {SLOTS} slots: ideal "
        f"makespan {ideal:.1f} s. Makespan = sbatch to the last point's end; running = first "
        "point's start to the last one's end. RPCs: sdiag, reset before each method.",
        "",
        "Load: " + "; ".join(_load(m, cols[m]) for m in METHODS) + ".",
        "",
        *h.table(
            [
                "method",
                "makespan",
                "/ ideal",
                "running",
                "submit RPCs",
                "step RPCs",
                "all RPCs",
                "n",
            ],
            rows,
        ),
        "",
        h.verdict(packed_ratio <= 1.15, f"packed within 1.15x of ideal ({packed_ratio:.2f}x)"),
        "",
        h.verdict(
            fewer >= 10,
            f"at least 10x fewer step and submit RPCs than the array ({fewer:.1f}x)",
        ),
        "",
        *_shared_note(cols),
        *h.reproduce(
            "export SLURM_CONF=/var/tmp/hpclaunch-testbed/slurm.conf",
            ".venv/bin/python bench/pack.py --reps 3",
        ),
    ]
    return h.section("pack", "Packed sweep against an array (`bench/pack.py`)", lines)


def main() -> None:
    args = h.parse(h.arguments(__doc__ or "", reps=3))
    data = h.results(args, SCRATCH.parent / "pack-results.json", lambda: measure(args.reps))
    h.publish(args, "pack", render(data))


if __name__ == "__main__":
    main()
