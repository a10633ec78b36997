"""Time to recover from a lost node: a spare in the same job against a requeue (a harness).

One rank (-N 1) saves a checkpoint and trains on; the bench crashes the rank's node
(testbed/crash-node.sh, as tests/test_e2e_faults.py does) and times crash -> the rank
resumed from its checkpoint (its rank_start in events.jsonl, time.time() on the node):

  spare    `hpclaunch run -N 1 --spares 1`: the ranks' step starts again on the spare
           inside the same job (--no-kill), once Slurm shows the node down
  requeue  `hpclaunch run -N 1 --requeue`: Slurm ends the job (NODE_FAIL), requeues it,
           and the next attempt starts on the other node

Both wait for Slurm to notice the node (SlurmdTimeout, 10 s on the testbed); after that,
the spare costs one srun, the requeue a trip through the queue. Reps alternate the two.
Crashes disturb every job on the testbed: the bench waits until it is idle, runs as
root, and brings every node back after each rep.

    export "$(sudo bash testbed/up.sh | tail -n 1)"  # or SLURM_CONF=<the running testbed's>
    flock /var/tmp/hpclaunch-testbed.lock env REPS=3 .venv/bin/python bench/spares.py

Options (bench/harness.py's): --reps (REPS, default 3), --quick (1 rep), --no-doc,
--doc FILE, --render-only (from bench/results/spares.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import harness as h  # bench/ is on sys.path when run as a script
from cluster import BINDIR

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import testbed  # noqa: E402

SAVED = REPO / "bench" / "results" / "spares.json"
SCRATCH = Path(os.environ.get("BENCH_SCRATCH", "/var/tmp/hpclaunch-bench")) / "spares"
METHODS = {"spare": ("--spares", "1"), "requeue": ("--requeue",)}
PROGRAM = """
import os, pathlib, time
ckpt = pathlib.Path(os.environ["HPCLAUNCH_CHECKPOINT_DIR"]) / "step"
if os.environ.get("HPCLAUNCH_RESUME") == "1" and ckpt.exists():
    print("resumed from step", ckpt.read_text(), flush=True)
else:
    ckpt.write_text("5")
    print("saved step 5", flush=True)
    time.sleep(600)
"""


def _events(run_dir: Path) -> list[dict[str, Any]]:
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.startswith("{")]


def _wait(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


def one(method: str) -> dict[str, float]:
    """Submit, crash the rank's node once it saved, time the rank's resumed start."""
    folder = SCRATCH / uuid.uuid4().hex[:8]
    folder.mkdir(parents=True)
    argv = [str(BINDIR / "hpclaunch"), "run", "-N", "1", "-t", "10:00", "--json"]
    argv += [*METHODS[method], "--", "python3", "-c", PROGRAM]
    env = {**os.environ, "HPCLAUNCH_CLUSTER": "slurm"}
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, check=True)
    run_dir = Path(json.loads(done.stdout)["run_dir"])

    def started() -> list[dict[str, Any]]:
        return [e for e in _events(run_dir) if e.get("event") == "rank_start"]

    first = _wait("the rank to start", started, 300)[0]
    time.sleep(2)  # the program has saved its step by now (it writes it first)
    crashed = str(first["node"])
    at = time.time()
    try:
        testbed.crash_node(crashed)

        def resumed() -> list[dict[str, Any]]:
            return [e for e in started() if float(e["time"]) > at]

        back = float(_wait("the rank to start again", resumed, 300)[0]["time"])
        bad = [e for e in _events(run_dir) if e.get("event") == "node_bad"]
    finally:
        testbed.restart_node(crashed)  # every node back, whatever happened
        subprocess.run([str(BINDIR / "hpclaunch"), "cancel", run_dir.name], cwd=folder, env=env,
                       capture_output=True, check=False)  # fmt: skip
    result = {"recovery_s": back - at}
    if bad:
        result["noticed_s"] = float(bad[0]["time"]) - at
    return result


def measure(reps: int) -> dict[str, Any]:
    found: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    for rep in range(reps):
        for method in h.order_of(list(METHODS), rep, h.ALTERNATE):
            testbed.wait_idle(timeout=600)
            found[method].append(one(method))
            print(method, found[method][-1], flush=True)
    return {"reps": reps, "at": h.utc_now(), "results": found, "slurmd_timeout": _slurmd_timeout()}


def _slurmd_timeout() -> str:
    """The testbed's SlurmdTimeout as `scontrol show config` says it ("10 sec")."""
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True)
    for line in shown.stdout.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "SlurmdTimeout":
            return value.strip().replace(" sec", " s")
    return "unknown"


def render(data: dict[str, Any]) -> str:
    cols = {m: h.columns(rows) for m, rows in data["results"].items()}
    rows = [
        ["`--spares 1`: the step again on the spare, same job",
         h.fmt(cols["spare"].get("recovery_s")), h.fmt(cols["spare"].get("noticed_s"))],
        ["`--requeue`: Slurm requeues, the next attempt elsewhere",
         h.fmt(cols["requeue"].get("recovery_s")),
         # The next attempt names the node (preflight.py lost) just before its ranks.
         h.fmt(cols["requeue"]["noticed_s"]) if "noticed_s" in cols["requeue"]
         else "(Slurm's NODE_FAIL)"],
    ]  # fmt: skip
    lines = [
        f"{data['reps']} rep(s) each, {data['at']}, the Slurm testbed (2 nodes, "
        f"SlurmdTimeout {data.get('slurmd_timeout', '20 s')}). Crash -> the rank's resumed "
        "start (its `rank_start` event), median (min-max):",
        "",
        *h.table(["recovery from a lost node", "crash → rank resumed", "crash → node bad"], rows),
        "",
        "Both wait for Slurm to mark the node down; after that a spare costs one srun in "
        "the running allocation, a requeue a pass through the queue (on a busy site: "
        "the wait of any new job).",
        "",
        *h.reproduce(
            f"flock /var/tmp/hpclaunch-testbed.lock env REPS={data['reps']} "
            ".venv/bin/python bench/spares.py"
        ),
    ]
    return h.section("spares", "Scale: bad nodes (`bench/spares.py`)", lines)


def main() -> int:
    args = h.parse(h.arguments(__doc__.splitlines()[0], reps=3))
    data = h.results(args, SAVED, lambda: measure(args.reps))
    h.publish(args, "spares", render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
