"""A held 1,000-point grid sweep, command to printed sweep id, side by side with
submitit and the floor in one run (a harness, not a test; issue 26, Performance).

bench/sweep.py measures submission and status; this one only the submission, with
the tree before the issue-26 fixes beside this one, and two floors that say where
hpclaunch's time goes. Per rep, interleaved, after one discarded warm-up rep:

  hpclaunch   `hpclaunch sweep --cluster slurm --grid a=1..100 --grid b=1..10
              --sbatch-arg=--hold --no-snapshot --json -- python3 train.py --a {a} --b {b}`,
              process start to the printed sweep id: this tree, and the baseline tree
              (SWEEP_BASELINE, default 27c0c09: before the fixes) from a `git archive` copy
  submitit    bench/sweep_submitit.py's process start to the printed array id
              (`map_array` of 1,000 calls, held)
  floor       `sbatch --array=0-999 --hold --wrap true`, the whole process
  imports     `python -c "import <what the sweep command imports>"`: start-up alone
  folders     1,000 point folders as hpclaunch lays them out (3 folders, 3 small
              files each), written by a bare Python loop into the run root's file system

Every array is held and cancelled by the harness (also on errors); before each one the
harness waits for job-table room (bench/sweep.py's Room: MaxJobCount, MinJobAge).

    export SLURM_CONF=/var/tmp/hpclaunch-testbed/slurm.conf
    env -u PYTHONDONTWRITEBYTECODE REPS=3 .venv/bin/python bench/sweep_submit.py [--no-doc]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import sweep as sw  # bench/sweep.py: cluster, job-table room, timing helpers
from benchdoc import write_section

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SCRATCH = sw.SCRATCH.parent / "sweep-submit"
BASELINE = os.environ.get("SWEEP_BASELINE", "27c0c09")
MARK_START, MARK_END = "<!-- bench:sweep-submit:start -->", "<!-- bench:sweep-submit:end -->"
IMPORTS = (
    "import hpclaunch.cli.main, hpclaunch.cli.sweep_cmd, hpclaunch.api, hpclaunch.sweeps.submit"
)


def baseline_src() -> Path:
    base = sw.fresh(SCRATCH / "baseline")
    archive = subprocess.run(["git", "archive", BASELINE, "src"], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {BASELINE}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
    return base / "src"


def hl(src: Path) -> list[str]:
    return [sw.PY, "-c", f"import sys; sys.path.insert(0, {str(src)!r}); "
            "from hpclaunch.cli.main import main; sys.exit(main())"]  # fmt: skip


class Run:
    def __init__(self, reps: int) -> None:
        self.reps = reps
        self.project = sw.make_project(SCRATCH / "project")
        self.run_root = sw.fresh(SCRATCH / "runs")
        self.partition = sw.default_partition()
        self.env = {**os.environ, "XDG_DATA_HOME": str(SCRATCH / "xdg")}
        for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "PYTHONDONTWRITEBYTECODE"):
            self.env.pop(var, None)
        self.src = {"this tree": ROOT / "src", "baseline": baseline_src()}
        self.samples: dict[str, list[float]] = {}

    def add(self, key: str, value: float, rep: int) -> None:
        if rep > 0:
            self.samples.setdefault(key, []).append(value)

    def hpclaunch(self, tree: str, rep: int) -> float:
        argv = [*hl(self.src[tree]), "sweep", "--cluster", "slurm"]
        argv += ["--run-root", str(self.run_root), "-J", sw.JOB_NAME, *sw.grid_args()]
        argv += ["--sbatch-arg=--hold", "--json", "--no-snapshot", "--"]
        argv += ["python3", "train.py", "--a", "{a}", "--b", "{b}"]
        sw.room()
        try:
            t_id, _, objs = sw.time_to_line(argv, self.env, self.project, "sweep_id")
        except sw.Failed as e:
            sw.JOBS.add(*[str(j) for o in e.objs for j in o.get("job_ids") or []])
            raise
        info = next(o for o in objs if "sweep_id" in o)
        sw.JOBS.add(*[str(j) for j in info.get("job_ids") or []])
        if info.get("points") != sw.POINTS:
            raise RuntimeError(f"unexpected answer: {info}")
        return t_id  # its 1,000 folders are removed at the end: a removal here would
        # still be going on in the file system's journal while the next method writes

    def submitit(self, rep: int) -> float:
        folder = sw.fresh(SCRATCH / "submitit")
        argv = [sw.PY, str(BENCH / "sweep_submitit.py"), str(folder), str(sw.POINTS)]
        argv += [self.partition, sw.JOB_NAME]
        sw.room()
        try:
            t_id, _, objs = sw.time_to_line(argv, self.env, SCRATCH, "job_id")
        except sw.Failed as e:
            sw.JOBS.add(*[str(o["job_id"]) for o in e.objs if "job_id" in o])
            raise
        sw.JOBS.add(str(objs[0]["job_id"]))
        return t_id

    def floor(self, rep: int) -> float:
        argv = ["sbatch", "--parsable", f"--array=0-{sw.POINTS - 1}", "--hold"]
        argv += ["-J", sw.JOB_NAME, "-p", self.partition, "-o", "/dev/null", "--wrap", "true"]
        sw.room()
        t0 = time.perf_counter()
        out = sw.sh(argv, env=self.env, cwd=SCRATCH)
        took = time.perf_counter() - t0
        sw.JOBS.add(out.strip().split(";")[0])
        return took

    def imports(self, rep: int) -> float:
        t0 = time.perf_counter()
        subprocess.run([sw.PY, "-c", IMPORTS], env=self.env, check=True, cwd=SCRATCH)
        return time.perf_counter() - t0

    def folders(self, rep: int) -> float:
        """The point folders alone: what the layout costs the file system, no hpclaunch."""
        top = SCRATCH / "runs" / f"layout-{rep}"  # removed at the end, as the sweeps
        text = "x" * 1500
        t0 = time.perf_counter()
        os.makedirs(top / "points")
        for i in range(sw.POINTS):
            folder = f"{top}/points/{i}"
            os.mkdir(folder)
            os.mkdir(f"{folder}/logs")
            os.mkdir(f"{folder}/checkpoints")
            for name in ("job.sh", "params.env", "run.json"):
                with open(f"{folder}/{name}", "w") as fh:
                    fh.write(text)
        return time.perf_counter() - t0


def measure(reps: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    sw.ensure_cluster()
    sw.fresh(SCRATCH)
    sw.ROOM = sw.Room()
    r = Run(reps)
    methods: dict[str, Callable[[int], float]] = {
        "floor": r.floor,
        "hpclaunch (this tree)": lambda rep: r.hpclaunch("this tree", rep),
        "submitit": r.submitit,
        "hpclaunch (baseline)": lambda rep: r.hpclaunch("baseline", rep),
        "imports": r.imports,
        "folders": r.folders,
    }
    try:
        for rep in range(reps + 1):
            for name, fn in methods.items():
                try:
                    r.add(name, fn(rep), rep)
                finally:
                    sw.JOBS.cancel()
            last = {k: v[-1] for k, v in r.samples.items() if v and rep > 0}
            print(f"rep {rep}: " + " ".join(f"{k}={v:.3f}" for k, v in last.items()), flush=True)
    finally:
        left = sw.JOBS.cancel_all()
        if left:
            print(f"warning: still queued after scancel: {left}", flush=True)
    shutil.rmtree(SCRATCH, ignore_errors=True)
    facts = sw.machine_facts(0)
    facts["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "facts": facts,
        "reps": reps,
        "samples": r.samples,
        "total_s": time.perf_counter() - t0,
        "waited_s": sw.ROOM.waited_s,
        "baseline": subprocess.run(
            ["git", "rev-parse", "--short", BASELINE], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
    }


def render(data: dict[str, Any]) -> list[str]:
    f, s, n = data["facts"], data["samples"], data["reps"]

    def cell(key: str) -> str:
        return sw.fmt(s.get(key))

    this, peer = sw.med(s.get("hpclaunch (this tree)")), sw.med(s.get("submitit"))
    base = sw.med(s.get("hpclaunch (baseline)"))
    verdict = "PASS" if this <= peer else "MISS"
    return [
        MARK_START,
        "## A held 1,000-point sweep, command to sweep id (`bench/sweep_submit.py`)",
        "",
        f"Measured {f.get('date', '')}; nproc {f.get('nproc')}, load {f['load']} (2 cores "
        "shared with other developers' tests, type checks and the testbed's slurmctld and "
        "nodes: taken under load; read the same-run ratios), slurm "
        f"{f.get('slurm')}, python {f.get('python')}, submitit {f.get('submitit')}. "
        f"Median (min-max) of n={n} interleaved reps after a warm-up rep; every array held "
        f"and cancelled. Baseline: the tree at {data['baseline']} (before the issue-26 fixes) "
        f"from a `git archive` copy, same interpreter. The harness took "
        f"{data['total_s']:.0f} s, {data['waited_s']:.0f} s of it waiting for job-table room.",
        "",
        "| what | time to the printed id |",
        "|---|---|",
        f"| hpclaunch sweep, --no-snapshot (this tree) | {cell('hpclaunch (this tree)')} |",
        f"| hpclaunch sweep, --no-snapshot (baseline) | {cell('hpclaunch (baseline)')} |",
        f"| peer: submitit, process start to array id (`map_array`) | {cell('submitit')} |",
        f"| floor: `sbatch --array=0-999 --hold --wrap true` | {cell('floor')} |",
        f"| floor: start-up and the sweep command's imports | {cell('imports')} |",
        f"| floor: 1,000 point folders (3 folders + 3 files each), bare loop | {cell('folders')} |",
        "",
        f"- {verdict}: this tree {this:.3f} s against submitit {peer:.3f} s in the same run "
        f"({this / peer:.2f}x; target at most 1.00x, aim 0.2 s); baseline {base:.3f} s "
        f"({base / peer:.2f}x)",
        "",
        "```bash",
        "export SLURM_CONF=/var/tmp/hpclaunch-testbed/slurm.conf",
        "env -u PYTHONDONTWRITEBYTECODE REPS=3 .venv/bin/python bench/sweep_submit.py",
        "```",
        MARK_END,
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=int(os.environ.get("REPS", "3")))
    p.add_argument("--no-doc", action="store_true")
    p.add_argument("--render-only", action="store_true")
    args = p.parse_args()
    results = SCRATCH.parent / "sweep-submit-results.json"
    if args.render_only:
        data = json.loads(results.read_text())
    else:
        data = measure(args.reps)
        results.write_text(json.dumps(data, indent=1))
    text = "\n".join(render(data))
    print(text)
    if not args.no_doc:
        write_section(sw.DOC, MARK_START, MARK_END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
