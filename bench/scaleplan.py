"""Runs at scale: planning 2 to 4,096 nodes x 8 ranks, and the bootstrap's cost per rank
with node files (a harness, not a test; issue 34).

  plan       plan, validate and render `hpclaunch run --dry-run -N NODES
             --tasks-per-node 8 --gpus-per-node 8 --no-snapshot -- python train.py` in this
             process (launching.plan_run + preview), the Slurm answers it needs (scontrol
             show config, sinfo's partitions) replayed by the suite's stand-in for Slurm's
             commands (tests/slurm_replay.py, tests/helpers_scale.py: the recorded sinfo line
             with NODES nodes of 64 cores and 8 GPUs), its caches cleared before each
             plan. Target: 4,096 nodes under 100 ms (median).
  bootstrap  `python -I -S RUN_DIR/bootstrap.py true` with HPCLAUNCH_LOG_DIR set, as a
             run folder holds it: the baseline tree's bootstrap (rank files), this tree's
             with rank files, and with node files (HPCLAUNCH_NODE_LOGS=1: the pump).
             Target: this tree's rank-file start within the baseline's noise.

Every method runs once per rep, in turn (interleaved), after one discarded warm-up rep.

    env -u PYTHONDONTWRITEBYTECODE .venv/bin/python bench/scaleplan.py [--reps 9]
        [--quick] [--no-doc | --doc FILE]

Environment: BENCH_SCRATCH (default /var/tmp/hpclaunch-bench; this harness uses and
empties its scaleplan/ folder), SCALEPLAN_BASELINE (a git revision; default main).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness as h  # bench/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's stand-in for Slurm's commands

import helpers_scale as scale  # noqa: E402 - tests/helpers_scale.py
from hpclaunch import node  # noqa: E402
from slurm_replay import SlurmReplay  # noqa: E402

PY = sys.executable
SCRATCH = Path(os.environ.get("BENCH_SCRATCH", "/var/tmp/hpclaunch-bench")) / "scaleplan"
BASELINE = os.environ.get("SCALEPLAN_BASELINE", "main")
NODES = (2, 64, 1024, 4096)
PLAN_TARGET_S = 0.100


def measure_plans(reps: int) -> dict[str, list[float]]:
    project = h.fresh(SCRATCH / "proj")
    env = {"USER": "bench", "PATH": "/usr/bin:/bin", "HOME": str(SCRATCH)}
    env.update(XDG_CONFIG_HOME=str(SCRATCH / "cfg"), XDG_DATA_HOME=str(SCRATCH / "data"))
    methods = {}
    for nodes in NODES:
        replay = SlurmReplay()

        def one(_: int, nodes: int = nodes, replay: SlurmReplay = replay) -> float:
            scale.install(replay, nodes, setattr)  # this size's answers
            took: float = scale.plan(nodes, project, env)[0]
            return took

        methods[f"{nodes:,} nodes x 8 ranks"] = one
    got = h.interleave(methods, reps, progress=h.print_metrics)
    return got.kept


def run_folder(name: str, bootstrap: bytes) -> Path:
    """A run folder's bootstrap: the loader as bootstrap.py, the module beside it."""
    folder = h.fresh(SCRATCH / name)
    (folder / node.RUN_DIR_NAME[node.LOADER]).write_bytes(node.path(node.LOADER).read_bytes())
    (folder / node.RUN_DIR_NAME[node.BOOTSTRAP]).write_bytes(bootstrap)
    return folder


def measure_bootstrap(reps: int) -> dict[str, list[float]]:
    old = subprocess.run(
        ["git", "show", f"{BASELINE}:src/hpclaunch/node/bootstrap.py"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    folders = {
        f"baseline ({BASELINE}), rank files": (run_folder("old", old), False),
        "this tree, rank files": (run_folder("new", node.path(node.BOOTSTRAP).read_bytes()), False),
        "this tree, node files": (
            run_folder("new-node", node.path(node.BOOTSTRAP).read_bytes()),
            True,
        ),
    }
    methods = {}
    for name, (folder, shared) in folders.items():
        env = {**os.environ, node.HPCLAUNCH_LOG_DIR: str(folder / "logs")}
        if shared:
            env[node.HPCLAUNCH_NODE_LOGS] = "1"
        argv = [PY, *node.PYTHON_FLAGS, str(folder / node.RUN_DIR_NAME[node.LOADER]), "true"]

        def one(_: int, argv: list[str] = argv, env: dict[str, str] = env) -> float:
            took, done = h.run_timed(argv, env=env)
            if done.returncode != 0:
                raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr[-300:]}")
            return took

        methods[name] = one
    got = h.interleave(methods, reps, warmup=3)
    return got.kept


def measure(reps: int) -> dict[str, Any]:
    started = time.monotonic()
    facts = h.machine_facts()
    plans = measure_plans(reps)
    boot = measure_bootstrap(reps * 4)
    facts["load after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {"facts": facts, "plans": plans, "boot": boot, "reps": reps,
            "total_s": time.monotonic() - started}  # fmt: skip


def render(data: dict[str, Any]) -> str:
    f, plans, boot = data["facts"], data["plans"], data["boot"]
    big = h.median(plans[f"{NODES[-1]:,} nodes x 8 ranks"])
    old, new, shared = boot.values()
    base = h.median(old)
    # Rep by rep (interleaved: a pair saw the same machine), robust to the load's swings.
    grown = h.paired_difference(new, old)[0]
    pump = h.paired_difference(shared, old)[0]
    rows = [[name, h.fmt(v, "ms"), str(len(v))] for name, v in plans.items()]
    boot_rows = [[name, h.fmt(v, "ms"), str(len(v))] for name, v in boot.items()]
    return h.section(
        "scaleplan",
        "Scale: runs (`bench/scaleplan.py`)",
        [
            f"Measured {f['date']}; {h.facts_line(f)} (this machine's 2 cores were shared "
            "with other developers' tests: compare within a table, same run). Interleaved, "
            "median (min-max) after a discarded warm-up; the harness took "
            f"{data['total_s']:.0f} s.",
            "",
            "### Plan, validate and render N nodes x 8 ranks (Slurm's answers replayed, "
            "in-process)",
            "",
            *h.table(["job", "plan + validate + render", "n"], rows),
            "",
            "### Bootstrap start per rank, `python -I -S RUN_DIR/bootstrap.py true`, logs on",
            "",
            *h.table(["bootstrap", "wall per start", "n"], boot_rows),
            "",
            "### Targets",
            "",
            "- "
            + h.verdict(
                big < PLAN_TARGET_S,
                f"{NODES[-1]:,} nodes x 8 ranks planned in "
                f"{big * 1000:.1f} ms (median; target under 100 ms)",
            ),
            "- "
            + h.verdict(
                grown <= base * 0.10,
                f"the bootstrap with rank files: {grown * 1000:+.1f} ms a start against the "
                f"baseline (median of the paired differences; the baseline's median "
                f"{base * 1000:.1f} ms; target within 10%, the start's noise here)",
            ),
            f"- with node files (the pump's fork and end): {pump * 1000:+.1f} ms a start "
            "against the baseline (median of the paired differences)",
            "",
            *h.reproduce(
                "env -u PYTHONDONTWRITEBYTECODE .venv/bin/python bench/scaleplan.py "
                f"--reps {data['reps']}"
            ),
        ],
    )


def main() -> int:
    args = h.parse(h.arguments(__doc__.splitlines()[0], reps=9))
    saved = SCRATCH.parent / "scaleplan-results.json"
    data = h.results(args, saved, lambda: measure(args.reps))
    h.publish(args, "scaleplan", render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
