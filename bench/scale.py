"""Costs that must not grow with what earlier runs left behind (a harness, not a test).

Two lines of issue 26's Performance section, each measured side by side in one run,
this tree against a baseline tree (default: the commit before the fixes), every
command a whole `python -m hpclaunch` process, interleaved (each rep runs every case
once, in turn), after one discarded warm-up rep:

  runs      `hpclaunch runs` (the default listing, newest 20) with 100 ended runs in
            the index, alone and beside 10 ended sweeps of 1,000 points each, the
            sweeps the newest (synthetic records as hpclaunch writes them, local runs
            and Slurm points that ended: no scheduler call). Target: with the sweeps
            within 20% of without. Floor: `hpclaunch --version`. The warm-up rep is the
            first listing after the sweeps ended, which writes their tallies.
  dry-run   `hpclaunch run --cluster slurm --dry-run -- python train.py` (the code
            snapshot planned) in a git project whose runs/ holds 75,000 files of
            earlier runs (7,500 run folders of 10 files) and is neither ignored nor the
            run root, against the same project with runs/ empty. Target: no growth.
            Peer: runs/ in .gitignore; floor: the same dry-run with --no-snapshot.

    export SLURM_CONF=/var/tmp/hpclaunch-testbed/slurm.conf   # the dry-run asks sinfo
    env -u PYTHONDONTWRITEBYTECODE .venv/bin/python bench/scale.py [--reps 7]
        [--quick] [--no-doc | --doc FILE]

Environment: BENCH_SCRATCH (default /var/tmp/hpclaunch-bench; this harness uses and
empties its scale/ folder), SCALE_BASELINE (a git revision; default below).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import harness as h  # bench/ is on sys.path when run as a script
from harness import fresh

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
SCRATCH = Path(os.environ.get("BENCH_SCRATCH", "/var/tmp/hpclaunch-bench")) / "scale"
# The tree before the issue-26 performance fixes (runs tallies, pruned snapshot walk).
BASELINE = os.environ.get("SCALE_BASELINE", "27c0c09")
RUNS, SWEEPS, POINTS = 100, 10, 1000
OLD_RUN_FOLDERS, FILES_PER_RUN = 7500, 10
RUNS_TARGET, DRY_TARGET = 1.20, 1.20


def run_id(day: int, n: int) -> str:
    """A run id as rundirs.new_run_id makes them, sortable: day, then n."""
    return f"202611{day:02d}-{n // 1000:02d}{n % 1000:04d}-000-{n % 0xFFFF:04x}"


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- records
def make_runs(root: Path) -> list[dict[str, Any]]:
    """RUNS ended local runs; their index entries."""
    entries = []
    for n in range(RUNS):
        rid = run_id(20, n)
        folder = root / "default" / rid
        (folder / "logs").mkdir(parents=True)
        write_json(
            folder / "run.json",
            {
                "run_id": rid, "run_dir": str(folder), "exp": "default", "cluster": "local",
                "backend": "local", "job_id": None, "job_ids": [], "state": "COMPLETED",
                "exit_code": 0, "submitted_at": 1.8e9, "attempts": 1, "nodes": 1,
                "tasks_per_node": 1, "command": ["python", "train.py"],
            },
        )  # fmt: skip
        entries.append(
            {"run_id": rid, "run_dir": str(folder), "job_id": None, "exp": "default",
             "cluster": "local", "submitted_at": 1.8e9}
        )  # fmt: skip
    return entries


def make_sweeps(root: Path) -> list[dict[str, Any]]:
    """SWEEPS ended Slurm sweeps of POINTS points (point records as folder.point_record
    writes them: all COMPLETED but the last, FAILED); their index entries."""
    entries = []
    for s in range(SWEEPS):
        sid, job = run_id(25, s), str(1000 + s)
        folder = root / "default" / sid
        points = []
        for i in range(POINTS):
            pdir = folder / "points" / str(i)
            (pdir / "logs").mkdir(parents=True)
            last = i == POINTS - 1
            write_json(
                pdir / "run.json",
                {
                    "run_id": f"{sid}:{i}", "sweep_id": sid, "point": i, "exp": "default",
                    "cluster": "slurm", "backend": "slurm", "run_dir": str(pdir),
                    "checkpoint_dir": str(pdir / "checkpoints"), "job_id": f"{job}_{i}",
                    "job_ids": [f"{job}_{i}"], "submitted_at": 1.8e9, "attempts": 1,
                    "state": "FAILED" if last else "COMPLETED", "exit_code": 3 if last else 0,
                    "command": ["python3", "train.py", "--a", str(i)], "params": {"a": i},
                    "nodes": 1, "tasks_per_node": 1, "launcher": "srun",
                },
            )  # fmt: skip
            points.append({"index": i, "params": {"a": i}, "args": ["--a", str(i)], "source": ""})
        write_json(
            folder / "sweep.json",
            {
                "sweep_id": sid, "exp": "default", "cluster": "slurm", "backend": "slurm",
                "sweep_dir": str(folder), "submitted_at": 1.8e9, "kind": "grid",
                "sacct_mode": "-c", "arrays": [{"job_id": job, "offset": 0, "points": POINTS,
                "spec": f"0-{POINTS - 1}", "attempt": 1, "submitted_at": 1.8e9}],
                "points": points, "space": [],
            },
        )  # fmt: skip
        entries.append(
            {"run_id": sid, "run_dir": str(folder), "job_id": job, "exp": "default",
             "cluster": "slurm", "submitted_at": 1.8e9, "sweep": True, "points": POINTS}
        )  # fmt: skip
    return entries


def write_index(xdg: Path, entries: list[dict[str, Any]]) -> None:
    folder = xdg / "hpclaunch"
    folder.mkdir(parents=True, mode=0o700)
    lines = "".join(json.dumps(e, sort_keys=True) + "\n" for e in entries)
    (folder / "runs.jsonl").write_text(lines)


# ----------------------------------------------------------------------------- project
def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *args],
        cwd=cwd, check=True, capture_output=True,
    )  # fmt: skip


def make_project(folder: Path, old_runs: int) -> Path:
    """A git project (train.py, 20 small modules, one commit) whose runs/ holds
    `old_runs` run folders of FILES_PER_RUN files, neither ignored nor committed."""
    fresh(folder)
    (folder / "train.py").write_text("print('hi')\n")
    (folder / "proj").mkdir()
    for i in range(20):
        (folder / "proj" / f"mod{i}.py").write_text(f"# module {i}\n" + "X = 1\n" * 300)
    git(folder, "init", "-q", ".")
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", "init")
    (folder / "runs" / "default").mkdir(parents=True)
    for n in range(old_runs):
        run = folder / "runs" / "default" / run_id(20, n)
        (run / "logs").mkdir(parents=True)
        for name in ("run.json", "spec.json", "job.sh", "events.jsonl", "git.diff"):
            (run / name).write_text("{}\n")
        for name in ("batch.out", "rank-0.out", "rank-1.out", "rank-2.out", "rank-3.out"):
            (run / "logs" / name).write_text("x\n")
    return folder


# ----------------------------------------------------------------------------- timing
class Case:
    def __init__(self, key: str, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.key, self.argv, self.cwd, self.env = key, argv, cwd, env
        self.before: Callable[[], object] = lambda: None
        self.after: Callable[[], object] = lambda: None

    def once(self, rep: int) -> float:
        """One whole process, its wall seconds."""
        self.before()
        took, p = h.run_timed(self.argv, cwd=self.cwd, env=self.env)
        self.after()
        if p.returncode != 0:
            raise RuntimeError(f"{self.key}: exited {p.returncode}: {p.stderr.strip()[-600:]}")
        return took


def hl(src: Path, *args: str) -> list[str]:
    return [PY, "-c", f"import sys; sys.path.insert(0, {str(src)!r}); "
            "from hpclaunch.cli.main import main; sys.exit(main())", *args]  # fmt: skip


def base_env(xdg: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCLAUNCH", "SLURM_JOB"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # else every start compiles again
    env["XDG_DATA_HOME"] = str(xdg)
    return env


def trees() -> dict[str, Path]:
    base = fresh(SCRATCH / "baseline")
    archive = subprocess.run(["git", "archive", BASELINE, "src"], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {BASELINE}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
    return {"baseline": base / "src", "this tree": ROOT / "src"}


def runs_cases(src: dict[str, Path]) -> list[Case]:
    store = fresh(SCRATCH / "records")
    runs = make_runs(store)
    sweeps = make_sweeps(store)
    write_index(SCRATCH / "xdg-runs", runs)
    write_index(SCRATCH / "xdg-both", runs + sweeps)
    cases = []
    for tree, path in src.items():
        for what, xdg in (("100 runs", "xdg-runs"), ("100 runs + 10 sweeps", "xdg-both")):
            env = base_env(SCRATCH / xdg)
            cases.append(Case(f"runs|{tree}|{what}", hl(path, "runs"), SCRATCH, env))
    env = base_env(SCRATCH / "xdg-runs")
    cases.append(Case("runs|floor|--version", hl(src["this tree"], "--version"), SCRATCH, env))
    return cases


def dry_cases(src: dict[str, Path]) -> list[Case]:
    empty = make_project(SCRATCH / "p-empty", 0)
    full = make_project(SCRATCH / "p-full", OLD_RUN_FOLDERS)
    elsewhere = str(SCRATCH / "run-root")
    dry = ["run", "--cluster", "slurm", "--run-root", elsewhere, "--dry-run"]
    tail = ["--", "python", "train.py"]
    env = base_env(SCRATCH / "xdg-dry")
    cases = []
    for tree, path in src.items():
        for what, proj in (("runs/ empty", empty), ("runs/ 75,000 files", full)):
            cases.append(Case(f"dry|{tree}|{what}", hl(path, *dry, *tail), proj, env))
    peer_argv = hl(src["this tree"], *dry, *tail)
    peer = Case("dry|peer|runs/ 75,000 files, ignored", peer_argv, full, env)
    ignore = full / ".gitignore"
    peer.before = lambda: ignore.write_text("runs/\n")
    peer.after = ignore.unlink
    cases.append(peer)
    floor = hl(src["this tree"], *dry, "--no-snapshot", *tail)
    cases.append(Case("dry|floor|runs/ 75,000 files, --no-snapshot", floor, full, env))
    return cases


def measure(reps: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    fresh(SCRATCH)
    src = trees()
    cases = runs_cases(src) + dry_cases(src)
    setup = time.perf_counter() - t0
    got = h.interleave({c.key: c.once for c in cases}, reps, catch=(), progress=h.print_metrics)
    shutil.rmtree(SCRATCH, ignore_errors=True)  # 75,000 + 10,000 files
    return {
        "facts": facts(),
        "reps": reps,
        "setup_s": setup,
        "total_s": time.perf_counter() - t0,
        "samples": got.kept,
        "first": {key: first[0] for key, first in got.warm_ups.items()},
    }


# ----------------------------------------------------------------------------- report
def facts() -> dict[str, str]:
    return {
        **h.machine_facts(),
        "git": h.first_line(["git", "--version"]).split()[-1],
        "baseline": subprocess.run(
            ["git", "rev-parse", "--short", BASELINE], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
    }


def table(data: dict[str, Any], kind: str, rows: list[str], peer: str, floor: str) -> list[str]:
    samples = data["samples"]
    out = []
    for what in rows:
        out.append(
            [what, *(h.fmt(samples[f"{kind}|{t}|{what}"]) for t in ("baseline", "this tree"))]
        )
    if peer:
        out.append([f"peer: {peer}", "", h.fmt(samples[f"{kind}|peer|{peer}"])])
    out.append([f"floor: {floor}", "", h.fmt(samples[f"{kind}|floor|{floor}"])])
    return h.table([f"{kind} (n={data['reps']} each)", "baseline", "this tree"], out)


def verdicts(data: dict[str, Any]) -> list[str]:
    out = []
    runs_what = "`runs` with 10 sweeps of 1,000 points"
    dry_what = "`--dry-run` with 75,000 files in runs/"
    for kind, small, big, target, what in (
        ("runs", "100 runs", "100 runs + 10 sweeps", RUNS_TARGET, runs_what),
        ("dry", "runs/ empty", "runs/ 75,000 files", DRY_TARGET, dry_what),
    ):
        for tree in ("baseline", "this tree"):
            samples = data["samples"]
            ratio = h.median(samples[f"{kind}|{tree}|{big}"]) / h.median(
                samples[f"{kind}|{tree}|{small}"]
            )
            text = (
                f"{tree}: {what}: {ratio:.2f}x the same command without them "
                f"(same run, medians; target at most {target:.2f}x)"
            )
            out.append(f"- {h.verdict(ratio <= target, text)}")
    first = data["first"]["runs|this tree|100 runs + 10 sweeps"]
    out.append(
        f"- the first listing after the sweeps ended (it reads their points once and writes "
        f"the tallies): {first:.3f} s (n=1, the warm-up rep)"
    )
    return out


def render(data: dict[str, Any]) -> str:
    f = data["facts"]
    return h.section(
        "scale",
        "What earlier runs leave behind (`bench/scale.py`)",
        [
            f"Measured {f.get('date', f.get('when'))}; nproc {f['nproc']}, load {f['load']} "
            "(this machine's 2 cores were shared with other developers' tests and type "
            "checks: the figures were taken under load; compare within a table, same run), "
            f"python {f['python']}, git {f['git']}. Baseline: the tree at {f['baseline']} "
            "(before the fixes), run from a `git archive` copy with the same interpreter. "
            "Whole `python -m hpclaunch` processes, interleaved, median (min-max) after one "
            f"warm-up rep; the harness took {data['total_s']:.0f} s ({data['setup_s']:.0f} s "
            "making the records and projects).",
            "",
            "### `hpclaunch runs`: 100 ended runs, and 10 ended sweeps of 1,000 points beside them",
            "",
            *table(data, "runs", ["100 runs", "100 runs + 10 sweeps"], "", "--version"),
            "",
            "### `hpclaunch run --cluster slurm --dry-run` in a project whose runs/ is neither "
            "ignored nor the run root",
            "",
            *table(
                data,
                "dry",
                ["runs/ empty", "runs/ 75,000 files"],
                "runs/ 75,000 files, ignored",
                "runs/ 75,000 files, --no-snapshot",
            ),
            "",
            "### Targets",
            "",
            *verdicts(data),
            "",
            *h.reproduce(
                "export SLURM_CONF=/var/tmp/hpclaunch-testbed/slurm.conf",
                "env -u PYTHONDONTWRITEBYTECODE .venv/bin/python bench/scale.py "
                f"--reps {data['reps']}",
            ),
        ],
    )


def main() -> int:
    args = h.parse(h.arguments(__doc__.splitlines()[0], reps=7))
    data = h.results(args, SCRATCH.parent / "scale-results.json", lambda: measure(args.reps))
    h.publish(args, "scale", render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
