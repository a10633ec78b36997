"""Sweep-cost benchmark on the Slurm testbed (a harness, not a test).

A held 1,000-point grid (--grid a=1..100 --grid b=1..10), submitted and watched three
ways: `hpclaunch sweep`, submitit's `map_array` (bench/sweep_submitit.py, its own
process per rep) and a hand-written `sbatch --array=0-999 --hold --wrap true` (the
floor). Every job is submitted HELD (nothing runs) and cancelled again by this harness,
also on errors. Per method it reports, as median (min-max) over n reps after one
discarded warm-up rep:

  submission   wall time from the command's start to the printed id (hpclaunch: the
               sweep id, with and without the code snapshot; submitit: its process
               start to the printed array id, and the `map_array` call alone;
               floor: the sbatch process)
  status       `hpclaunch sweep status SWEEP --json` while the 1,000 tasks are queued:
               the first one after submission and the steady state (hyperfine -N);
               submitit: one `watcher.update()`; floor: the `squeue -r` that
               hpclaunch runs, alone; and at the end, the
               first status of the harness's earlier sweeps that slurmctld has purged
               since their cancel (MinJobAge), which accounting must answer
  parse        `hpclaunch.sweeps.arrays.parse_squeue` of a synthetic 10,000-task
               `squeue -r` listing (10 arrays, mixed states), in-process, timeit

Scheduler calls are counted on the warm-up rep (so the shims' cost stays out of the
timed reps): a folder of logging shims (sbatch, squeue, sacct, scontrol, sacctmgr,
scancel, sinfo, srun) goes first on PATH for the measured process only; each appends
its argv to a log and execs the real binary. The table says calls per submission and
per status refresh, per command. PASS/MISS against the targets of the sweep issue are
printed (never asserted), and the sweep section of docs/benchmarks.md is rewritten.

    export SLURM_CONF=/var/tmp/hpclaunch-testbed/slurm.conf
    REPS=5 PATH=$PWD/.venv/bin:$PATH .venv/bin/python bench/sweep.py [--no-doc | --doc FILE]
    .venv/bin/python bench/sweep.py --render-only   # the doc section from the last run
    .venv/bin/python bench/sweep.py --quick         # 1 rep, 2 steady-state runs: a check

The job table sets the pace, not the CPU: every task of a held array counts against
MaxJobCount (10,000 on the testbed) and a cancelled array keeps its records until
MinJobAge (300 s) has passed. Each rep submits four 1,000-task arrays, so before every
submission the harness waits until the table (all users' records) has room for it plus
SWEEPBENCH_RESERVE slots (default 3,000) left to the other users of the testbed, and it
reports how long it waited. REPS=5 makes 4 x 6 = 24 submissions, about 18 minutes,
mostly asleep; REPS=2, 12 submissions, about 7 minutes.

Environment: REPS (default 5), SLURM_CONF (when unset: the testbed's
/var/tmp/hpclaunch-testbed/slurm.conf), SWEEPBENCH_RESERVE (see above), BENCH_SCRATCH
(default /var/tmp/hpclaunch-bench; this harness uses its sweep/ folder, emptied at the
start: the throwaway git project, the run root, submitit's folder, the shims, the raw
results as results.json). Jobs are submitted as the calling user under one job name
unique to the run, which the final clean-up also cancels by.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import timeit
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

import cluster  # bench/ is on sys.path when run as a script
import harness as h
from cluster import BINDIR, PY, default_partition, sh
from harness import fresh

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SCRATCH = Path(os.environ.get("BENCH_SCRATCH", "/var/tmp/hpclaunch-bench")) / "sweep"
SHIMMED = ("sbatch", "squeue", "sacct", "scontrol", "sacctmgr", "scancel", "sinfo", "srun")
A_VALUES, B_VALUES = 100, 10
POINTS = A_VALUES * B_VALUES
PARSE_TASKS, PARSE_ARRAYS = 10_000, 10
TARGET_SUBMIT_S = 1.0
TARGET_STATUS_S = 0.5
TARGET_PARSE_S = 0.100
JOB_NAME = f"hlbench-sweep-{os.getpid()}"  # every job of this run; the clean-up's backstop
MAX_ERRORS = 2  # a method is dropped after this many failed reps
# Job-table slots (MaxJobCount) left free for the other users of the testbed: a
# submission waits until the table, all users' records counted, has this much room
# beside its own 1,000 tasks. See ROOM below.
RESERVE = int(os.environ.get("SWEEPBENCH_RESERVE", "3000"))
ROOM_TIMEOUT_S = 900.0


# ----------------------------------------------------------------------------- helpers
def hpclaunch_argv() -> list[str]:
    exe = BINDIR / "hpclaunch"
    if exe.exists():
        return [str(exe)]
    return [PY, "-c", "import sys; from hpclaunch.cli.main import main; sys.exit(main())"]


# ----------------------------------------------------------------------------- cluster
def ensure_cluster() -> None:
    cluster.ensure_cluster()


def config_value(key: str, default: int) -> int:
    for line in sh(["scontrol", "show", "config"]).splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            word = value.strip().split()[0] if value.strip() else ""
            return int(word) if word.isdigit() else default
    return default


def listed(job_id: str) -> bool:
    """Whether slurmctld still holds a record of this job (any state)."""
    p = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i"], capture_output=True, text=True
    )
    return p.returncode == 0 and bool(p.stdout.strip())


def job_records() -> int:
    """Job records slurmctld holds now, all users, every array task counted (as
    MaxJobCount counts them), finished ones not yet purged (MinJobAge) included."""
    return len(sh(["squeue", "-h", "-r", "-t", "all", "-o", "%i"]).splitlines())


class Room:
    """Waits before a submission until the job table has room for it plus RESERVE.

    Each task of a held array counts against MaxJobCount, and a cancelled array keeps
    its records until MinJobAge has passed (300 s on the testbed, purged about once a
    minute after that): a rep of four 1,000-task submissions holds 4,000 slots for 5-6
    minutes. Without this wait the harness would fill the table and make slurmctld (and
    hpclaunch's own check) refuse the other users' jobs."""

    def __init__(self) -> None:
        self.max_jobs = config_value("MaxJobCount", 10000)
        self.min_age = config_value("MinJobAge", 300)
        self.waited_s = 0.0

    def wait(self, tasks: int) -> None:
        t0 = time.monotonic()
        said = 0.0
        while True:
            held = job_records()
            if held + tasks + RESERVE <= self.max_jobs:
                break
            now = time.monotonic() - t0
            if now > ROOM_TIMEOUT_S:
                raise RuntimeError(f"no room in the job table after {now:.0f} s ({held} records)")
            if now - said >= 30.0 or said == 0.0:
                print(
                    f"  waiting for job-table room: {held} records + {tasks} > MaxJobCount "
                    f"{self.max_jobs} - reserve {RESERVE} (cancelled arrays are purged "
                    f"MinJobAge {self.min_age} s after they end)",
                    flush=True,
                )
                said = now or 1e-9
            time.sleep(5.0)
        self.waited_s += time.monotonic() - t0


ROOM: Optional[Room] = None


def room(tasks: int = POINTS) -> None:
    if ROOM is not None:
        ROOM.wait(tasks)


class Jobs:
    """Every job id this run submitted. cancel() (after each method's rep) spares the
    kept ones, cancel_all() (at the end, also on errors) does not."""

    def __init__(self) -> None:
        self.open: list[str] = []
        self.kept: set[str] = set()

    def add(self, *ids: str) -> None:
        self.open += [i for i in ids if i]

    def cancel(self) -> None:
        ids = [i for i in self.open if i not in self.kept]
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True)
        self.open = [i for i in self.open if i in self.kept]

    def cancel_all(self) -> list[str]:
        """The ids, then everything under this run's job name; returns what is left."""
        self.kept.clear()
        self.cancel()
        subprocess.run(
            ["scancel", "--name", JOB_NAME, "--user", str(os.getuid())], capture_output=True
        )
        out = subprocess.run(
            ["squeue", "-h", "-n", JOB_NAME, "-o", "%i %T"], capture_output=True, text=True
        ).stdout
        return [ln for ln in out.splitlines() if ln.strip() and "CANCELLED" not in ln]


JOBS = Jobs()


# ----------------------------------------------------------------------------- shims
SHIM = """#!/bin/sh
printf '%s\\n' "{name} $*" >> "$SWEEPBENCH_CALLS"
exec {real} "$@"
"""


def make_shims(folder: Path) -> Path:
    fresh(folder)
    for name in SHIMMED:
        real = shutil.which(name, path=os.environ["PATH"])
        if real is None:
            continue
        shim = folder / name
        shim.write_text(SHIM.format(name=name, real=shlex.quote(real)))
        shim.chmod(0o755)
    return folder


class Counting:
    """The environment of a measured process whose scheduler calls are counted."""

    def __init__(self, shims: Path, log: Path) -> None:
        self.shims, self.log = shims, log

    def env(self, base: dict[str, str]) -> dict[str, str]:
        self.log.write_text("")
        path = f"{self.shims}{os.pathsep}{base['PATH']}"
        return {**base, "PATH": path, "SWEEPBENCH_CALLS": str(self.log)}

    def calls(self) -> list[str]:
        return [ln.split(" ", 1)[0] for ln in self.log.read_text().splitlines() if ln.strip()]


def per_command(names: list[str]) -> str:
    counts = Counter(names)
    if not counts:
        return "none"
    return ", ".join(
        f"{n} {c}"
        for c, n in sorted(((c, n) for n, c in counts.items()), key=lambda t: (-t[0], t[1]))
    )


# ----------------------------------------------------------------------------- project
FILES = {
    "train.py": "import argparse\n\np = argparse.ArgumentParser()\np.add_argument('--a')\n"
    "p.add_argument('--b')\nprint(vars(p.parse_args()))\n",
    "README.md": "# sweep bench project\n",
    "pyproject.toml": '[project]\nname = "proj"\nversion = "0"\n',
}


def make_project(folder: Path) -> Path:
    """A throwaway git repository (a train.py and a small package, one commit): the
    default `hpclaunch sweep` snapshots it."""
    fresh(folder)
    for name, text in FILES.items():
        (folder / name).write_text(text)
    pkg = folder / "proj"
    pkg.mkdir()
    for i in range(20):  # ~20 modules of ~2 KB, a small project
        (pkg / f"mod{i}.py").write_text(f"# module {i}\n" + "X = 1\n" * 300)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    sh([*git, "init", "-q", "."], cwd=folder)
    sh([*git, "add", "-A"], cwd=folder)
    sh([*git, "commit", "-q", "-m", "init"], cwd=folder)
    return folder


# ----------------------------------------------------------------------------- methods
def grid_args() -> list[str]:
    a = ",".join(str(i) for i in range(1, A_VALUES + 1))
    b = ",".join(str(i) for i in range(1, B_VALUES + 1))
    return ["--grid", f"a={a}", "--grid", f"b={b}"]


class Failed(RuntimeError):
    """A measured command failed; `objs` are the JSON lines it printed before (ids to
    cancel)."""

    def __init__(self, text: str, objs: list[dict[str, Any]]) -> None:
        super().__init__(text)
        self.objs = objs


def time_to_line(
    argv: list[str], env: dict[str, str], cwd: Path, key: str
) -> tuple[float, float, list[dict[str, Any]]]:
    """Start argv; seconds until a stdout line holding `key` (JSON), seconds until exit,
    and every JSON line printed. Failed when it exits non-zero or never prints `key`."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    t_line, objs = float("nan"), []
    for line in p.stdout:
        if line.lstrip().startswith("{"):
            obj = json.loads(line)
            objs.append(obj)
            if key in obj and t_line != t_line:
                t_line = time.perf_counter() - t0
    err = p.stderr.read() if p.stderr else ""
    rc = p.wait()
    t_exit = time.perf_counter() - t0
    if rc != 0 or t_line != t_line:
        raise Failed(f"{shlex.join(argv[:3])} ... exited {rc}: {err.strip()[-800:]}", objs)
    return t_line, t_exit, objs


class Bench:
    """One run of the harness: where things live and what was measured."""

    def __init__(self, reps: int) -> None:
        self.reps = reps
        self.project = make_project(SCRATCH / "project")
        self.run_root = fresh(SCRATCH / "runs")
        self.counting = Counting(make_shims(SCRATCH / "shims"), SCRATCH / "calls.log")
        self.partition = default_partition()
        self.env = {**os.environ, "XDG_DATA_HOME": str(SCRATCH / "xdg")}
        for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID"):  # never "inside an allocation"
            self.env.pop(var, None)
        self.samples: dict[str, list[float]] = {}
        self.calls: dict[str, list[str]] = {}
        self.errors: dict[str, list[str]] = {}
        self.notes: dict[str, Any] = {}
        self.keep: Optional[tuple[str, str]] = None  # (sweep id, array id) left queued
        self.sweeps: list[tuple[str, str]] = []  # every hpclaunch sweep: (sweep id, array id)

    def env_for(self, rep: int, what: str) -> dict[str, str]:
        return self.counting.env(self.env) if rep == 0 else dict(self.env)

    def record_calls(self, rep: int, what: str) -> None:
        if rep == 0:
            self.calls[what] = self.counting.calls()

    # -- hpclaunch
    def hpclaunch(self, snapshot: bool, rep: int, last: bool) -> dict[str, float]:
        tag = "hl_snap" if snapshot else "hl_nosnap"
        argv = [*hpclaunch_argv(), "sweep", "--cluster", "slurm", "--run-root", str(self.run_root)]
        argv += ["-J", JOB_NAME, *grid_args(), "--sbatch-arg=--hold", "--json"]
        if not snapshot:
            argv.append("--no-snapshot")
        argv += ["--", "python3", "train.py", "--a", "{a}", "--b", "{b}"]
        room()
        try:
            t_id, t_exit, objs = time_to_line(
                argv, self.env_for(rep, tag), self.project, "sweep_id"
            )
        except Failed as e:
            JOBS.add(*[str(j) for o in e.objs for j in o.get("job_ids") or []])
            raise
        self.record_calls(rep, f"{tag}_submit")
        info = next(o for o in objs if "sweep_id" in o)
        JOBS.add(*[str(j) for j in info.get("job_ids") or []])
        self.sweeps += [(str(info["sweep_id"]), str(j)) for j in info.get("job_ids") or []]
        if info.get("points") != POINTS or len(info.get("job_ids") or []) != 1:
            raise RuntimeError(f"unexpected submission answer: {info}")
        # The first status after submission (it writes what it learnt into the points).
        t_first, counts = self.status(info["sweep_id"], rep, f"{tag}_status_first")
        self.notes[f"{tag}_counts"] = counts
        if rep == 0:  # and a second one, counted: the steady state's calls
            self.status(info["sweep_id"], rep, f"{tag}_status_again")
        if last and snapshot:  # left queued for the steady-state status, then cancelled
            self.keep = (info["sweep_id"], str(info["job_ids"][0]))
            JOBS.kept.add(self.keep[1])
        return {f"{tag}_submit": t_id, f"{tag}_exit": t_exit, "hl_status_first": t_first}

    def status(self, sweep_id: str, rep: int, what: str) -> tuple[float, dict[str, int]]:
        argv = [*hpclaunch_argv(), "sweep", "status", sweep_id, "--json"]
        env = self.env_for(rep, what)
        t, p = h.run_timed(argv, cwd=self.project, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"sweep status exited {p.returncode}: {p.stderr.strip()[-800:]}")
        self.record_calls(rep, what)
        counts = json.loads(p.stdout)["counts"]
        if sum(counts.values()) != POINTS:
            raise RuntimeError(f"sweep status counted {counts}")
        return t, counts

    # -- floor
    def floor(self, rep: int) -> dict[str, float]:
        argv = ["sbatch", "--parsable", f"--array=0-{POINTS - 1}", "--hold", "-J", JOB_NAME]
        argv += ["-p", self.partition, "-o", "/dev/null", "--wrap", "true"]
        room()
        env = self.env_for(rep, "floor_submit")
        t_submit, out = h.timed(lambda: sh(argv, env=env, cwd=SCRATCH))
        self.record_calls(rep, "floor_submit")
        job_id = out.strip().split(";")[0]
        JOBS.add(job_id)
        # The floor of a status refresh: hpclaunch's own squeue, alone.
        from hpclaunch.sweeps import arrays

        env = self.env_for(rep, "floor_status")
        t_status, listing = h.timed(lambda: sh([*arrays.SQUEUE_ARGV, "-j", job_id], env=env))
        self.record_calls(rep, "floor_status")
        if len(listing.splitlines()) != POINTS:
            raise RuntimeError(f"squeue -r listed {len(listing.splitlines())} tasks of {job_id}")
        return {"floor_submit": t_submit, "floor_status": t_status}

    # -- submitit
    def submitit(self, rep: int) -> dict[str, float]:
        folder = fresh(SCRATCH / "submitit" / f"rep{rep}")
        argv = [PY, str(BENCH / "sweep_submitit.py"), str(folder), str(POINTS)]
        argv += [self.partition, JOB_NAME]
        room()
        env = self.env_for(rep, "submitit")
        try:
            t_id, _, objs = time_to_line(argv, env, SCRATCH, "job_id")
        except Failed as e:  # its job id may be printed before it failed
            JOBS.add(*[str(o["job_id"]) for o in e.objs if "job_id" in o])
            raise
        first, second = objs[0], objs[1] if len(objs) > 1 else {}
        JOBS.add(str(first["job_id"]))
        names = self.counting.calls() if rep == 0 else []
        if rep == 0:
            refresh = list(second.get("refresh_calls") or [])
            states = list(second.get("states_calls") or [])
            submit = names[: len(names) - len(refresh) - len(states)]
            self.calls["submitit_submit"] = submit
            self.calls["submitit_refresh"] = refresh
            self.calls["submitit_states"] = states
        got = {"submitit_submit": t_id, "submitit_map": float(first["map_s"])}
        got["submitit_import"] = float(first["import_s"])
        if "refresh_s" in second:
            got["submitit_status"] = float(second["refresh_s"])
            self.notes["submitit_states"] = second.get("states")
        return got

    # -- status of sweeps Slurm has forgotten
    def status_purged(self, limit: int) -> None:
        """`sweep status` of cancelled sweeps whose records slurmctld has purged
        (MinJobAge): squeue no longer lists them, so accounting must answer. Their
        points still say PENDING in their run.json (no status ran since the cancel).
        Counted and timed in the same run (the shims' few ms are inside the time)."""
        purged = [(sid, aid) for sid, aid in self.sweeps if not listed(aid)][:limit]
        for i, (sweep_id, _) in enumerate(purged):
            what = f"hl_status_purged_{i}"
            self.counting.log.write_text("")
            env = self.counting.env(self.env)
            argv = [*hpclaunch_argv(), "sweep", "status", sweep_id, "--json"]
            t, p = h.run_timed(argv, cwd=self.project, env=env)
            if p.returncode != 0:
                raise RuntimeError(f"sweep status exited {p.returncode}: {p.stderr[-800:]}")
            self.samples.setdefault("hl_status_purged", []).append(t)
            self.calls[what] = self.counting.calls()
            self.notes.setdefault("hl_purged_counts", []).append(json.loads(p.stdout)["counts"])
            print(f"purged sweep {sweep_id}: status {t:.3f} s, {per_command(self.calls[what])}")

    # -- steady-state status (hyperfine)
    def status_steady(self, runs: int) -> None:
        if self.keep is None:
            return
        sweep_id, array_id = self.keep
        try:
            cmd = [*hpclaunch_argv(), "sweep", "status", sweep_id, "--json"]
            js = SCRATCH / "hyperfine-status.json"
            argv = h.hyperfine_argv([cmd], runs, js, warmup=2, options=["--output", "null"])
            if shutil.which("hyperfine"):
                sh(argv, env=self.env, cwd=self.project)
                times = h.hyperfine_times(["status"], js)["status"]
            else:  # fallback: our own loop
                times = [self.status(sweep_id, 1, "status_steady")[0] for _ in range(runs)]
            self.samples["hl_status_steady"] = [float(t) for t in times]
        finally:
            JOBS.kept.discard(array_id)
            JOBS.cancel()


# ----------------------------------------------------------------------------- parsing
REASONS = ("Priority", "Resources", "JobHeldUser", "Dependency")


def synthetic_listing(tasks: int = PARSE_TASKS, n_arrays: int = PARSE_ARRAYS) -> str:
    """A `squeue -r -t all -o %F|%K|%A|%T|%r` listing (hpclaunch's SQUEUE_ARGV) of
    `tasks` array tasks in `n_arrays` arrays, as Slurm prints it: per 20 tasks, 4
    COMPLETED, 1 FAILED, 1 CANCELLED and 2 RUNNING under their own job ids, 12 PENDING
    sharing the array's record (%A = %F) with a reason; plus 20 lines of jobs that are
    not arrays (%K N/A), which the parser skips."""
    lines: list[str] = []
    per = tasks // n_arrays
    for k in range(n_arrays):
        array_id = 700_000 + k * (per + 10)
        for task in range(per):
            own = str(array_id + 1 + task)
            slot = task % 20
            if slot < 4:
                lines.append(f"{array_id}|{task}|{own}|COMPLETED|None")
            elif slot == 4:
                lines.append(f"{array_id}|{task}|{own}|FAILED|NonZeroExitCode")
            elif slot == 5:
                lines.append(f"{array_id}|{task}|{own}|CANCELLED|None")
            elif slot < 8:
                lines.append(f"{array_id}|{task}|{own}|RUNNING|None")
            else:
                reason = REASONS[(task // 20) % len(REASONS)]
                lines.append(f"{array_id}|{task}|{array_id}|PENDING|{reason}")
    for j in range(20):
        jid = 800_000 + j
        lines.append(f"{jid}|N/A|{jid}|RUNNING|None")
    return "\n".join(lines) + "\n"


def bench_parse(repeats: int) -> tuple[list[float], dict[str, Any]]:
    """parse_squeue of the synthetic listing, in-process: timeit, one call per repeat
    after one discarded call (which fills the parser's state-word cache)."""
    from hpclaunch.sweeps import arrays

    text = synthetic_listing()
    found = arrays.parse_squeue(text)
    states = Counter(t.state for t in found.values())
    own = sum(1 for t in found.values() if t.job_id)
    if len(found) != PARSE_TASKS:
        raise RuntimeError(f"parse_squeue found {len(found)} of {PARSE_TASKS} tasks")
    times = timeit.repeat(lambda: arrays.parse_squeue(text), number=1, repeat=repeats)
    info: dict[str, Any] = {
        "tasks": len(found),
        "lines": len(text.splitlines()),
        "bytes": len(text),
    }
    info.update({"states": dict(states), "own_ids": own})
    return times, info


# ----------------------------------------------------------------------------- run
def run_all(b: Bench) -> None:
    """Rep 0 counts the scheduler calls (shims on PATH) and is not timed; reps 1..REPS
    are timed. The methods take turns within a rep; each one's jobs are cancelled
    right after it, so every submission finds the same queue."""
    methods: dict[str, Callable[[int], dict[str, float]]] = {
        "floor": b.floor,
        "hpclaunch --no-snapshot": lambda rep: b.hpclaunch(False, rep, rep == b.reps),
        "hpclaunch": lambda rep: b.hpclaunch(True, rep, rep == b.reps),
        "submitit": b.submitit,
    }
    got = h.interleave(
        methods,
        b.reps,
        max_errors=MAX_ERRORS,
        after=lambda _: JOBS.cancel(),
        progress=h.print_metrics,
    )
    for name in methods:
        for key, values in h.columns(got.kept[name]).items():
            b.samples.setdefault(key, []).extend(values)
    b.errors.update(got.errors)


# ----------------------------------------------------------------------------- report
def machine_facts(queued_at_start: int) -> dict[str, str]:
    hf = shutil.which("hyperfine")
    return {
        **h.machine_facts(slurm=True, interpreter=PY, user=True),
        "submitit": h.module_version("submitit"),
        "hyperfine": sh([hf, "--version"]).split()[-1] if hf else "unavailable",
        "tasks queued at start": str(queued_at_start),
    }


def cell(data: dict[str, Any], key: str, unit: str = "s", note: str = "") -> str:
    xs = data["samples"].get(key)
    return f"{h.fmt(xs, unit)}{note}" if xs else "n/a"


def calls_cell(data: dict[str, Any], *keys: str) -> str:
    seen = [per_command(data["calls"][k]) for k in keys if k in data["calls"]]
    if not seen:
        return "n/a"
    uniq = list(dict.fromkeys(seen))
    return uniq[0] if len(uniq) == 1 else " / ".join(seen)


def results_table(data: dict[str, Any]) -> list[str]:
    n = data["reps"]
    steady_n = len(data["samples"].get("hl_status_steady") or [])
    purged_n = len(data["samples"].get("hl_status_purged") or [])
    purged_keys = sorted(k for k in data["calls"] if k.startswith("hl_status_purged_"))
    rows = [
        (
            f"held {POINTS}-point submission, no code snapshot: start to printed id",
            cell(data, "hl_nosnap_submit"),
            cell(data, "submitit_submit", note=" ¹"),
            cell(data, "floor_submit", note=" ²"),
        ),
        (
            "same, with the code snapshot (hpclaunch's default)",
            cell(data, "hl_snap_submit"),
            "n/a (ships pickles, no code)",
            "n/a",
        ),
        (
            "the in-process submission call alone",
            "n/a",
            cell(data, "submitit_map", note=" (`map_array`)"),
            "n/a",
        ),
        (
            "scheduler calls per submission",
            calls_cell(data, "hl_nosnap_submit", "hl_snap_submit"),
            calls_cell(data, "submitit_submit"),
            calls_cell(data, "floor_submit"),
        ),
        (
            "status of the 1,000 held tasks: first refresh after submission",
            cell(data, "hl_status_first", note=" ³"),
            cell(data, "submitit_status", note=" ⁴"),
            cell(data, "floor_status", note=" ⁵"),
        ),
        (
            f"status, steady state (hyperfine -N, n={steady_n})",
            cell(data, "hl_status_steady"),
            "n/a",
            "n/a",
        ),
        (
            "scheduler calls per status refresh",
            calls_cell(data, "hl_snap_status_first", "hl_snap_status_again"),
            calls_cell(data, "submitit_refresh"),
            calls_cell(data, "floor_status"),
        ),
        (
            f"status of a cancelled sweep slurmctld has purged, first refresh (n={purged_n}) ⁶",
            cell(data, "hl_status_purged"),
            "n/a",
            "n/a",
        ),
        (
            "scheduler calls, that refresh",
            calls_cell(data, *purged_keys),
            "n/a",
            "n/a",
        ),
        (
            f"parse a {PARSE_TASKS:,}-task `squeue -r` listing (in-process, n="
            f"{len(data['samples'].get('parse') or [])})",
            cell(data, "parse", "ms"),
            "n/a",
            "n/a",
        ),
    ]
    head = [f"what (n={n} unless said)", "hpclaunch", "submitit", "floor (`sbatch --array`)"]
    return h.table(head, rows)


def footnotes(data: dict[str, Any]) -> list[str]:
    notes = data["notes"]
    parse = notes.get("parse", {})
    sub_states = notes.get("submitit_states") or {}
    hl_counts = notes.get("hl_snap_counts") or notes.get("hl_nosnap_counts") or {}
    return [
        "¹ a Python process from its start to the printed array id: `import submitit` "
        f"({h.fmt(data['samples'].get('submitit_import'))}), `AutoExecutor` + parameters, "
        f"`map_array` over {POINTS} points (one pickle per point, one `sbatch --array="
        f"0-{POINTS - 1}%256 --hold`).",
        f"² `sbatch --parsable --array=0-{POINTS - 1} --hold --wrap true`, the whole process.",
        "³ `hpclaunch sweep status SWEEP --json`, the whole process, once per submitted "
        "sweep (both kinds), right after submission: the first time it hears of the "
        f"tasks (all held: reason JobHeldUser). It saw {hl_counts}.",
        "⁴ one forced `watcher.update()` in the submitting process (no interpreter start); "
        f"it then read every job's state from the watcher's cache: {sub_states}. "
        "submitit asks `sacct` only; the testbed has no accounting database "
        "(AccountingStorageType=accounting_storage/none), so that sacct fails and "
        "submitit does not know the states.",
        "⁵ hpclaunch's own `squeue -r -h -t all -o %F|%K|%A|%T|%r -j ARRAY`, alone.",
        "⁶ the harness's earlier sweeps, cancelled while held and gone from squeue "
        "(MinJobAge), whose points still said PENDING: accounting must answer "
        "(here the job completion file, `sacct -c`). Whole process, shims on PATH. "
        f"It saw {notes.get('hl_purged_counts') or 'n/a'}.",
        f"The parse input: {parse.get('lines', '?')} lines ({parse.get('bytes', 0) // 1024} "
        f"KiB), {PARSE_ARRAYS} arrays, tasks {parse.get('states', {})}, "
        f"{parse.get('own_ids', '?')} with their own job id, plus 20 non-array jobs.",
        "Scheduler calls were counted on the warm-up rep through logging shims first on "
        "PATH (sbatch, squeue, sacct, scontrol, sacctmgr, scancel, sinfo, srun), for the "
        "measured process only; the timed reps ran without them.",
    ]


def targets(data: dict[str, Any]) -> list[str]:
    out: list[str] = []
    s, c = data["samples"], data["calls"]

    def verdict(ok: bool, text: str, known: bool = True) -> None:
        out.append(h.verdict(ok, text, known))

    for key, label in (("hl_nosnap_submit", "without"), ("hl_snap_submit", "with")):
        t = h.median(s.get(key))
        verdict(
            t < TARGET_SUBMIT_S,
            f"`hpclaunch sweep` of {POINTS} held points {label} the code snapshot: "
            f"{t:.3f} s < 1 s to the printed sweep id",
            t == t,
        )
        calls = c.get(key)
        n_sbatch = Counter(calls or [])["sbatch"]
        verdict(
            n_sbatch == 1,
            f"one sbatch call per submission {label} the snapshot: {n_sbatch}",
            calls is not None,
        )
    for key, label in (("hl_snap_status_first", "first"), ("hl_snap_status_again", "next")):
        calls = c.get(key)
        cnt = Counter(calls or [])
        others = sum(v for k, v in cnt.items() if k not in ("squeue", "sacct"))
        verdict(
            cnt["squeue"] <= 1 and cnt["sacct"] <= 1 and others == 0,
            f"`sweep status` ({label} refresh) asks at most one squeue and one sacct: "
            f"{per_command(calls or [])}",
            calls is not None,
        )
    purged = sorted(k for k in c if k.startswith("hl_status_purged_"))
    if purged:
        worst = max((c[k] for k in purged), key=len)
        cnt = Counter(worst)
        others = sum(v for k, v in cnt.items() if k not in ("squeue", "sacct"))
        verdict(
            cnt["squeue"] <= 1 and cnt["sacct"] <= 1 and others == 0,
            "`sweep status` of a purged sweep asks at most one squeue and one sacct: "
            f"{per_command(worst)}",
        )
    else:
        verdict(False, "`sweep status` of a purged sweep: not measured", False)
    for key, label in (("hl_status_steady", "steady state"), ("hl_status_first", "first refresh")):
        t = h.median(s.get(key))
        verdict(
            t < TARGET_STATUS_S,
            f"`sweep status` of the 1,000 queued tasks ({label}): {t:.3f} s < 0.5 s",
            t == t,
        )
    t = h.median(s.get("parse"))
    verdict(
        t < TARGET_PARSE_S,
        f"parse_squeue of {PARSE_TASKS:,} tasks: {t * 1e3:.1f} ms < 100 ms",
        t == t,
    )
    return out


def render(data: dict[str, Any]) -> list[str]:
    body = [f"### A held {POINTS:,}-point grid (100 x 10)", "", *results_table(data), ""]
    body += footnotes(data)
    errors = {k: v for k, v in data["errors"].items() if v}
    if errors:
        body += ["", "Failed reps:"]
        body += [f"- {k}: {len(v)} failed, last: {v[-1][:300]}" for k, v in errors.items()]
    body += ["", "### Targets", "", *[f"- {t}" for t in targets(data)]]
    return body


def doc_section(body: list[str], data: dict[str, Any]) -> str:
    facts, room = data["facts"], data["room"]
    return h.section(
        "sweep",
        "Sweeps on the Slurm testbed (`bench/sweep.py`)",
        [
            f"Measured {facts['date']}; {h.facts_line(facts)}. Jobs were submitted as "
            f"{facts['user']}, "
            "held (`--hold`: nothing ran) and cancelled by the harness. Median (min-max) "
            "over n reps after one warm-up rep that counted the scheduler calls. hpclaunch "
            "ran from a throwaway git project (a train.py, 20 small modules; one commit) "
            "with a fresh --run-root: `hpclaunch sweep --cluster slurm --grid a=1,...,100 "
            "--grid b=1,...,10 --sbatch-arg=--hold --json [--no-snapshot] -- python3 "
            "train.py --a {a} --b {b}`. The testbed's two nodes and slurmctld share this "
            f"machine's CPUs. The harness took {data['total_s']:.0f} s, of which "
            f"{room['waited_s']:.0f} s waiting for job-table room: each held 1,000-task "
            f"array takes 1,000 of the MaxJobCount {room['max_jobs']} slots until "
            f"MinJobAge ({room['min_age']} s) after it is cancelled, and the harness "
            f"leaves {room['reserve']} slots to the testbed's other users.",
            "",
            *body,
            "",
            *h.reproduce(
                "bash scripts/setup.sh --test && .venv/bin/pip install -e '.[bench]'",
                'export "$(sudo bash testbed/up.sh | tail -n 1)"  # (re)starts the testbed',
                f"REPS={data['reps']} PATH=$PWD/.venv/bin:$PATH .venv/bin/python bench/sweep.py",
            ),
        ],
    )


# ----------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    p = h.arguments("hpclaunch sweep benchmark (Slurm testbed)", reps=5)
    p.add_argument("--status-runs", type=int, default=0, help="hyperfine runs (default 2*reps)")
    args = h.parse(p)
    if args.quick:
        args.status_runs = 2
    return args


def measure(reps: int, status_runs: int) -> dict[str, Any]:
    global ROOM
    t0 = time.perf_counter()
    ensure_cluster()
    fresh(SCRATCH)
    queued = len(sh(["squeue", "-h", "-r", "-o", "%i"]).splitlines())
    ROOM = Room()
    b = Bench(reps)
    try:
        run_all(b)
        b.status_steady(status_runs or max(10, 2 * reps))
        try:
            b.status_purged(reps)
        except Exception as e:
            b.errors.setdefault("status of purged sweeps", []).append(f"{type(e).__name__}: {e}")
    finally:
        left = JOBS.cancel_all()
        if left:
            print(f"warning: jobs of this run still queued after scancel: {left}", flush=True)
    parse_times, parse_info = bench_parse(max(20, 4 * reps))
    b.samples["parse"] = parse_times
    b.notes["parse"] = parse_info
    shutil.rmtree(SCRATCH / "runs", ignore_errors=True)  # ~1,000 folders per sweep
    shutil.rmtree(SCRATCH / "submitit", ignore_errors=True)
    return {
        "facts": machine_facts(queued),
        "reps": reps,
        "samples": b.samples,
        "calls": b.calls,
        "errors": b.errors,
        "notes": b.notes,
        "total_s": time.perf_counter() - t0,
        "room": {
            "max_jobs": ROOM.max_jobs,
            "min_age": ROOM.min_age,
            "reserve": RESERVE,
            "waited_s": ROOM.waited_s,
        },
    }


def main() -> int:
    args = parse_args()

    def measured() -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            data = measure(args.reps, args.status_runs)
        finally:
            JOBS.cancel_all()
        data["total_s"] = time.perf_counter() - t0
        return data

    data = h.results(args, SCRATCH / "results.json", measured)
    waited = data["room"]["waited_s"]
    print(f"harness took {data['total_s']:.0f} s ({waited:.0f} s waiting for job-table room)")
    print(f"raw results in {SCRATCH / 'results.json'}")
    h.publish(args, "sweep", doc_section(render(data), data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
