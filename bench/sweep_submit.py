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
  folders     1,000 point folders as hpclaunch once laid them out (3 folders, 3 small
              files each; it writes none per point since 2d979eb), written by a bare
              Python loop into the run root's file system: what that layout cost

Every array is held and cancelled by the harness (also on errors); before each one the
harness waits for job-table room (bench/sweep.py's Room: MaxJobCount, MinJobAge).

    export SLURM_CONF=/var/tmp/hpclaunch-testbed/slurm.conf
    env -u PYTHONDONTWRITEBYTECODE REPS=3 .venv/bin/python bench/sweep_submit.py [--no-doc]

Options are bench/harness.py's: --reps, --quick (1 rep), --no-doc, --doc FILE,
--render-only (from BENCH_SCRATCH's sweep-submit-results.json).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import cluster
import harness as h
import sweep as sw  # bench/sweep.py: cluster, job-table room, timing helpers

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SCRATCH = sw.SCRATCH.parent / "sweep-submit"
BASELINE = os.environ.get("SWEEP_BASELINE", "27c0c09")
IMPORTS = (
    "import hpclaunch.cli.main, hpclaunch.cli.sweep_cmd, hpclaunch.api, hpclaunch.sweeps.submit"
)


def baseline_src() -> Path:
    base = h.fresh(SCRATCH / "baseline")
    archive = subprocess.run(["git", "archive", BASELINE, "src"], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {BASELINE}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
    return base / "src"


def hl(src: Path) -> list[str]:
    return [cluster.PY, "-c", f"import sys; sys.path.insert(0, {str(src)!r}); "
            "from hpclaunch.cli.main import main; sys.exit(main())"]  # fmt: skip


class Run:
    def __init__(self, reps: int) -> None:
        self.reps = reps
        self.project = sw.make_project(SCRATCH / "project")
        self.run_root = h.fresh(SCRATCH / "runs")
        self.partition = cluster.default_partition()
        self.env = {**os.environ, "XDG_DATA_HOME": str(SCRATCH / "xdg")}
        for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "PYTHONDONTWRITEBYTECODE"):
            self.env.pop(var, None)
        self.src = {"this tree": ROOT / "src", "baseline": baseline_src()}
        for src in self.src.values():  # bytecode of every module, as pip makes at install
            argv = [cluster.PY, "-m", "compileall", "-q", str(src / "hpclaunch")]
            subprocess.run(argv, env=self.env, check=True, stdout=subprocess.DEVNULL)

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
        folder = h.fresh(SCRATCH / "submitit")
        argv = [cluster.PY, str(BENCH / "sweep_submitit.py"), str(folder), str(sw.POINTS)]
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
        took, out = h.timed(lambda: cluster.sh(argv, env=self.env, cwd=SCRATCH))
        sw.JOBS.add(out.strip().split(";")[0])
        return took

    def imports(self, rep: int) -> float:
        argv = [cluster.PY, "-c", IMPORTS]
        return h.timed(lambda: subprocess.run(argv, env=self.env, check=True, cwd=SCRATCH))[0]

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
    h.fresh(SCRATCH)
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
        got = h.interleave(
            methods, reps, catch=(), after=lambda _: sw.JOBS.cancel(), progress=h.print_metrics
        )
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
        "samples": got.kept,
        "total_s": time.perf_counter() - t0,
        "waited_s": sw.ROOM.waited_s,
        "baseline": subprocess.run(
            ["git", "rev-parse", "--short", BASELINE], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
    }


def render(data: dict[str, Any]) -> str:
    f, s, n = data["facts"], data["samples"], data["reps"]

    def cell(key: str) -> str:
        return h.fmt(s.get(key))

    this, peer = h.median(s.get("hpclaunch (this tree)")), h.median(s.get("submitit"))
    base = h.median(s.get("hpclaunch (baseline)"))
    return h.section(
        "sweep-submit",
        "A held 1,000-point sweep, command to sweep id (`bench/sweep_submit.py`)",
        [
            f"Measured {f.get('date', '')}; nproc {f.get('nproc')}, load {f['load']} (2 cores "
            "shared with other developers' tests, type checks and the testbed's slurmctld and "
            "nodes: taken under load; read the same-run ratios), slurm "
            f"{f.get('slurm')}, python {f.get('python')}, submitit {f.get('submitit')}. "
            f"Median (min-max) of n={n} interleaved reps after a warm-up rep; every array held "
            f"and cancelled. Baseline: the tree at {data['baseline']} (SWEEP_BASELINE; the "
            "default 27c0c09 is before the issue-26 fixes) from a `git archive` copy, same "
            f"interpreter; both trees compiled first, as pip does. The harness took "
            f"{data['total_s']:.0f} s, {data['waited_s']:.0f} s of it waiting for job-table "
            "room.",
            "",
            *h.table(
                ["what", "time to the printed id"],
                [
                    ["hpclaunch sweep, --no-snapshot (this tree)", cell("hpclaunch (this tree)")],
                    ["hpclaunch sweep, --no-snapshot (baseline)", cell("hpclaunch (baseline)")],
                    ["peer: submitit, process start to array id (`map_array`)", cell("submitit")],
                    ["floor: `sbatch --array=0-999 --hold --wrap true`", cell("floor")],
                    ["floor: start-up and the sweep command's imports", cell("imports")],
                    [
                        "the old layout: 1,000 point folders (3 folders + 3 files each), "
                        "bare loop (hpclaunch writes none per point now)",
                        cell("folders"),
                    ],
                ],
            ),
            "",
            "- "
            + h.verdict(
                this <= peer,
                f"this tree {this:.3f} s against submitit {peer:.3f} s in the same run "
                f"({this / peer:.2f}x; target at most 1.00x, aim 0.2 s); baseline {base:.3f} s "
                f"({base / peer:.2f}x)",
            ),
            "- Where this tree's time went, and what issue 26 cut (tests/test_sweep_submit_cost.py "
            "locks each in): scontrol show config, sinfo and sacctmgr are asked at once "
            "(slurm/discover.ask_together, slurm/along.py), not one after the other; two git "
            "calls, not four (one `git status --porcelain=v2 --branch` says a clean tree has "
            "no diff); the shipped bootstrap's bytecode is copied from the installed one, not "
            "compiled for every sweep; no tarfile import; no folder per point (each array task "
            "makes its own as it starts: records/pointrecords.make_folder for a host-side "
            "writer before then); no difflib, hashlib, secrets, socket, tempfile, random "
            "imports. What remains: the interpreter's start and the imports (about 250 "
            "hpclaunch, click and standard modules; ~50 dataclasses built), the "
            "three Slurm queries before sbatch, sweep.json written twice (before sbatch, "
            "then with the arrays and the point records).",
            "",
            *h.reproduce(
                "export SLURM_CONF=/var/tmp/hpclaunch-testbed/slurm.conf",
                f"env -u PYTHONDONTWRITEBYTECODE SWEEP_BASELINE={data['baseline']} REPS={n} "
                ".venv/bin/python bench/sweep_submit.py",
            ),
        ],
    )


def main() -> int:
    args = h.parse(h.arguments(__doc__.splitlines()[0], reps=3))
    saved = SCRATCH.parent / "sweep-submit-results.json"
    data = h.results(args, saved, lambda: measure(args.reps))
    h.publish(args, "sweep-submit", render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
