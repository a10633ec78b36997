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
    .venv/bin/python bench/startup.py --reps 7 [--src OTHER_TREE/src]

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
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

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
    start = time.perf_counter()
    proc = subprocess.run(argv(case, venv), cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
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
        for venv in paths.values():
            run_once(case, venv, env, work)  # warm-up: .pyc files, page cache
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
        for _ in range(reps):
            for name, venv in paths.items():
                got[name].append(run_once(case, venv, env, work))
        for name, xs in got.items():
            walls, cpus = [x[0] for x in xs], [x[1] for x in xs]
            rows.append(
                {
                    "case": case,
                    "venv": name,
                    "n": len(xs),
                    "median_s": statistics.median(walls),
                    "min_s": min(walls),
                    "max_s": max(walls),
                    "cpu_median_s": statistics.median(cpus),
                }
            )
    return rows


def _cell(row: Optional[dict[str, Any]]) -> str:
    if row is None:
        return "n/a"
    ms = {k: 1000 * row[k] for k in ("median_s", "min_s", "max_s", "cpu_median_s")}
    return (
        f"{ms['median_s']:.0f} ms ({ms['min_s']:.0f}-{ms['max_s']:.0f}), "
        f"CPU {ms['cpu_median_s']:.0f} ms"
    )


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per case, the venvs side by side."""
    venvs = list(dict.fromkeys(row["venv"] for row in rows))
    cases = list(dict.fromkeys(row["case"] for row in rows))
    found = {(row["case"], row["venv"]): row for row in rows}
    lines = [
        "| what | " + " | ".join(f"{v} venv, median (min-max)" for v in venvs) + " | n |",
        "|---" * (len(venvs) + 2) + "|",
    ]
    for case in cases:
        cells = [_cell(found.get((case, v))) for v in venvs]
        n = max(found[(case, v)]["n"] for v in venvs if (case, v) in found)
        lines.append(f"| {CASES.get(case, case)} | " + " | ".join(cells) + f" | {n} |")
    return "\n".join(lines)


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
    args = p.parse_args()
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {list(CASES)}")
    rows = measure(args.reps, args.root, args.src, cases)
    print(describe(args.root))
    print(f"source: {args.src.resolve() if args.src else REPO / 'src'}\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
