"""Start-up cost of `hpclaunch` in a lean and a heavy venv (a harness, not a test).

Users install hpclaunch into the venv that holds their training stack, so its start-up
must not grow with what else is installed. This builds (or reuses) two venvs outside the
repository and times, in both, as median (min-max) over n reps after one discarded
warm-up, the reps of the two venvs taken in turn:

  import     `import hpclaunch.config.profiles`, timed inside the interpreter
  dry-run    `hpclaunch run --cluster slurm -N 2 --tasks-per-node 2 --dry-run -- python
             train.py`, the whole process
  submit     `hpclaunch run --cluster slurm --no-snapshot -- true`, the whole process,
             which ends once it has printed the job id (the testbed's)

lean  = `python3 -m venv` + `pip install -e REPO`;
heavy = the same + torch==2.13.0 (the local wheel), lightning, jax[cpu], wandb.

    export SLURM_CONF=/var/tmp/hpclaunch-testbed/slurm.conf
    .venv/bin/python bench/startup.py --reps 7 [--src OTHER_TREE/src] [--venvs lean]
    .venv/bin/python bench/startup.py --quick   # 1 rep of import and dry-run: a check

--src runs another source tree through the same venvs (it goes first on PYTHONPATH):
a before/after comparison without reinstalling. PYTHONDONTWRITEBYTECODE is dropped, so
the warm-up writes the .pyc files a user's install has. Jobs are submitted as the calling
user; the harness waits for each job to leave the queue before the next rep.
bench/launch.py can call `measure(reps)` and `table(rows)`.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import harness as h  # bench/ is on sys.path when run as a script

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(os.environ.get("HPC_BENCH_DIR", "/var/tmp/hpc-bench"))
VENVS = {"lean": [], "heavy": ["torch==2.13.0", "lightning", "jax[cpu]", "wandb"]}
CASES = {
    "import": "`import hpclaunch.config.profiles` (in-process)",
    "dry-run": "`hpclaunch run --cluster slurm -N 2 --tasks-per-node 2 --dry-run`",
    "submit": "`hpclaunch run --cluster slurm --no-snapshot -- true` to the job id",
}
IMPORT_PROBE = (
    "import time; w, c = time.perf_counter(), time.process_time(); "
    "import hpclaunch.config.profiles; "
    "print(time.perf_counter() - w, time.process_time() - c)"
)
JOB_ID = re.compile(r"\bjob (\d+)\b")


def ensure_venv(name: str, root: Path = BENCH_DIR, python: str = "python3") -> Path:
    """The venv `root/name` with hpclaunch (editable, this repository) and its extras."""
    venv = root / name
    want = " ".join(["-e", str(REPO), *VENVS[name]])
    marker = venv / "hpclaunch-bench.txt"
    if marker.exists() and marker.read_text() == want:
        return venv
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "-e", str(REPO), *VENVS[name]], check=True)
    marker.write_text(want)
    return venv


def bench_env(root: Path, src: Optional[Path]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.pop("PYTHONPATH", None)
    if src is not None:
        env["PYTHONPATH"] = str(src.resolve())
    # No user profiles of the caller's, no entries in the caller's run index.
    env["XDG_CONFIG_HOME"] = str(root / "xdg-config")
    env["XDG_DATA_HOME"] = str(root / "xdg-data")
    return env


def argv(case: str, venv: Path) -> list[str]:
    exe = str(venv / "bin" / "hpclaunch")
    if case == "import":
        return [str(venv / "bin" / "python"), "-c", IMPORT_PROBE]
    if case == "dry-run":
        shape = ["-N", "2", "--tasks-per-node", "2", "--dry-run"]
        return [exe, "run", "--cluster", "slurm", *shape, "--", "python", "train.py"]
    return [exe, "run", "--cluster", "slurm", "--no-snapshot", "--", "true"]


def wait_gone(job: str, env: dict[str, str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, env=env)
        if not out.stdout.strip():
            return
        time.sleep(0.1)


def run_once(case: str, venv: Path, env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one rep."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, proc = h.run_timed(argv(case, venv), cwd=cwd, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"{case} in {venv.name} exited {proc.returncode}: {proc.stderr[-600:]}")
    if case == "import":
        wall, cpu = (float(x) for x in proc.stdout.split())
    if case == "submit":
        found = JOB_ID.search(proc.stdout + proc.stderr)
        if not found:
            raise RuntimeError(f"no job id in: {proc.stdout[-300:]} {proc.stderr[-300:]}")
        wait_gone(found.group(1), env)
    return wall, cpu


def measure(
    reps: int = 7,
    root: Path = BENCH_DIR,
    src: Optional[Path] = None,
    cases: tuple[str, ...] = tuple(CASES),
    venvs: tuple[str, ...] = tuple(VENVS),
) -> list[dict[str, Any]]:
    """One row per case and venv: wall and CPU seconds (median, min, max) over `reps`."""
    env = bench_env(root, src)
    paths = {name: ensure_venv(name, root) for name in venvs}
    work = root / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "train.py").write_text("print('hello')\n")
    rows: list[dict[str, Any]] = []
    for case in cases:
        if case == "submit" and not env.get("SLURM_CONF"):
            raise SystemExit("submit needs the testbed: export SLURM_CONF=...")
        # The venvs in turn, after one warm-up each (.pyc files, page cache).
        methods = {
            name: (lambda rep, c=case, v=venv: run_once(c, v, env, work))
            for name, venv in paths.items()
        }
        got = h.interleave(methods, reps, catch=())
        for name, xs in got.kept.items():
            wall = h.summary([x[0] for x in xs])
            rows.append(
                {
                    "case": case,
                    "venv": name,
                    "n": wall.n,
                    "median_s": wall.median,
                    "min_s": wall.min,
                    "max_s": wall.max,
                    "cpu_median_s": h.median([x[1] for x in xs]),
                }
            )
    return rows


def _cell(row: Optional[dict[str, Any]]) -> str:
    if row is None:
        return "n/a"
    wall = h.fmt_range(row["median_s"], row["min_s"], row["max_s"], "ms", digits=0)
    return f"{wall}, CPU {1000 * row['cpu_median_s']:.0f} ms"


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per case, the venvs side by side."""
    venvs = list(dict.fromkeys(row["venv"] for row in rows))
    cases = list(dict.fromkeys(row["case"] for row in rows))
    found = {(row["case"], row["venv"]): row for row in rows}
    cells = []
    for case in cases:
        per_venv = [_cell(found.get((case, v))) for v in venvs]
        n = max(found[(case, v)]["n"] for v in venvs if (case, v) in found)
        cells.append([CASES.get(case, case), *per_venv, str(n)])
    head = ["what", *(f"{v} venv, median (min-max)" for v in venvs), "n"]
    return "\n".join(h.table(head, cells))


def describe(root: Path = BENCH_DIR, venvs: tuple[str, ...] = tuple(VENVS)) -> str:
    """One line on the machine and the venvs (interpreter, how many distributions)."""
    probe = (
        "import sys, importlib.metadata as m; "
        "print(sys.version.split()[0], len(list(m.distributions())), m.version('pydantic'))"
    )
    parts = [f"nproc {os.cpu_count()}", f"load {os.getloadavg()[0]:.2f}", platform.release()]
    for name in venvs:
        py = str(root / name / "bin" / "python")
        out = subprocess.run([py, "-c", probe], capture_output=True, text=True).stdout.split()
        if len(out) == 3:
            parts.append(f"{name}: python {out[0]}, {out[1]} distributions, pydantic {out[2]}")
    return "; ".join(parts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--reps", type=int, default=int(os.environ.get("REPS", "7")))
    p.add_argument("--root", type=Path, default=BENCH_DIR, help="where the venvs live")
    p.add_argument("--src", type=Path, help="another tree's src/ to run instead")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ",".join(CASES))
    p.add_argument("--venvs", default=",".join(VENVS), help="comma-separated: " + ",".join(VENVS))
    p.add_argument("--quick", action="store_true", help="1 rep of import and dry-run: a check")
    args = p.parse_args()
    if args.quick:
        args.reps, args.cases = 1, "import,dry-run"
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    venvs = tuple(v.strip() for v in args.venvs.split(",") if v.strip())
    unknown = [c for c in cases if c not in CASES] + [v for v in venvs if v not in VENVS]
    if unknown:
        raise SystemExit(f"unknown case(s) or venv(s) {unknown}; known: {[*CASES, *VENVS]}")
    rows = measure(args.reps, args.root, args.src, cases, venvs)
    print(describe(args.root, venvs))
    print(f"source: {args.src.resolve() if args.src else REPO / 'src'}\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
