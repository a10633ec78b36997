"""Launch-cost benchmark on the Slurm testbed (a harness, not a test).

Starts the same 2-node x 2-task gloo program (bench/rank_time.py) seven ways:
hpclaunch's srun launcher, hpclaunch's torchrun launcher, a hand-written sbatch + srun
script (the floor), submitit and torchx, and hpclaunch's srun launcher on a job with
GPUs with its GPU watch on (sampling the nvidia-smi stand-in) and with --no-watch. Per
method it reports, as median (min-max), n:

  (a) allocation -> last rank in user code
  (b) allocation -> last rank past init_process_group("gloo")
  (c) wall time of the submitting command until it has the job id
      (hpclaunch, torchx, sbatch: the whole process; submitit: the `submit()` call)

Allocation times come from slurmctld's log (ms resolution), so the scheduler's tick
(the submit -> allocation wait, shown as an extra column) is kept out of (a) and (b).
It also measures the bootstrap's per-rank overhead with hyperfine, prints PASS/MISS
against the project's targets, and rewrites the bench section of docs/benchmarks.md.

    export "$(bash testbed/up.sh | tail -n 1)"; REPS=7 .venv/bin/python bench/launch.py

It also times hpclaunch's own start-up in a lean venv and in a heavy one that holds
torch, lightning, jax and wandb as a user's training venv does (bench/startup.py), side
by side.

Options (bench/harness.py's and its own): --reps (REPS, default 7; one extra warm-up rep
is discarded), --quick (1 rep of the srun launcher and the floor, 5 bootstrap runs, no
venv part: a check), --no-doc, --doc FILE, --render-only (bench/results/launch.json).
Environment: SLURM_CONF (when unset, the running testbed's), BENCH_SCRATCH (a folder every node
sees, default /var/tmp/hpclaunch-bench), HPCLAUNCH_TESTBED_STATE (slurmctld's state
folder, default /var/tmp/hpclaunch-testbed). Jobs are submitted as the calling user.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import cluster  # bench/ is on sys.path when run as a script
import harness as h
from cluster import BINDIR, PY, default_partition, sh
from harness import fresh

from hpclaunch import node

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RANK_TIME = BENCH / "rank_time.py"
BOOTSTRAP = ROOT / "src" / "hpclaunch" / "node" / "bootstrap.py"
RESULTS = BENCH / "results"
STATE = Path(os.environ.get("HPCLAUNCH_TESTBED_STATE", "/var/tmp/hpclaunch-testbed"))
CTLD_LOG = STATE / "log" / "slurmctld.log"
SCRATCH = Path(os.environ.get("BENCH_SCRATCH", "/var/tmp/hpclaunch-bench"))
NODES, TASKS_PER_NODE = 2, 2
NRANKS = NODES * TASKS_PER_NODE
MAX_ERRORS = 2  # a method is dropped after this many failed reps (a rep is not retried)
TARGET_SRUN_OVER_FLOOR = 0.024  # aiming at 0.015
TARGET_RUN_CMD = 0.3
TARGET_BOOTSTRAP = 0.010  # per rank, boot+logs over the program alone
TARGET_STARTUP = 0.2  # `hpclaunch run` to the job id, and a dry-run, in a heavy ML venv


# ----------------------------------------------------------------------------- helpers
@dataclass(frozen=True)
class Submitted:
    """What a launch method returns: the Slurm job id and how long submitting took."""

    job_id: str
    t_submit: float  # time.time() just before the submitting command
    cmd_s: float  # wall time of the submitting command / call
    run_dir: str = ""


@dataclass
class Series:
    """Samples of one method; `error` is set when the method could not run."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def error(self) -> str:
        return self.errors[-1] if self.errors else ""


def tool(name: str) -> str:
    """A console script next to our interpreter (skips shims on PATH), else PATH's."""
    local = BINDIR / name
    return str(local) if local.exists() else (shutil.which(name) or name)


# ----------------------------------------------------------------------------- cluster
def wait_idle() -> None:
    cluster.wait_idle(900.0, poll=0.05)


def cancel_all() -> None:
    subprocess.run(["scancel", "--user", str(os.getuid())], capture_output=True)


DNS_PROBE = """
import os, socket, threading, time
t = time.time()
look = lambda: socket.getnameinfo(("::ffff:127.0.0.1", 1, 0, 0), 0)
th = threading.Thread(target=look, daemon=True)
th.start(); th.join(3.0)
print(f"{time.time() - t:.3f}", flush=True)
os._exit(0)  # do not wait for a lookup still stuck in the resolver
"""


def dns_stall_s() -> float:
    """How long one reverse lookup of an IPv4-mapped address takes on a node (cap 3 s).

    c10d looks up its peers' names (for log lines) with getnameinfo on IPv6-mapped
    addresses, which /etc/hosts never answers: on nodes that cannot reach a DNS server
    every such lookup stalls for the resolver's timeout, and that lands in (b).
    """
    out = sh(["srun", "-N", "1", "-n", "1", PY, "-c", DNS_PROBE], timeout=30)
    return float(out.split()[-1])


_ALLOC = r"^\[(\S+)\] sched\S*: (?:Allocate|_start_job: Started) JobId={}[ (+]"


def alloc_time(job_id: str, timeout: float = 5.0) -> float:
    """Epoch time at which slurmctld allocated (or backfill-started) the job."""
    pat = re.compile(_ALLOC.format(re.escape(job_id)), re.MULTILINE)
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = pat.search(CTLD_LOG.read_text(errors="replace"))
        if m:
            # slurmctld logs local time with ms ("2026-11-21T23:49:00.123").
            return dt.datetime.fromisoformat(m.group(1)).timestamp()
        time.sleep(0.1)
    raise RuntimeError(f"no allocation line for job {job_id} in {CTLD_LOG}")


def wait_ranks(out: Path, timeout: float = 150.0) -> list[list[str]]:
    """Wait for all rank files; fail early when the queue empties without them."""
    deadline, next_check = time.time() + timeout, time.time() + 2.0
    while time.time() < deadline:
        names = [n for n in os.listdir(out) if n.startswith("r")]
        if len(names) >= NRANKS:
            return [(out / n).read_text().split() for n in sorted(names)]
        if time.time() > next_check:
            next_check = time.time() + 1.0
            if not sh(["squeue", "-h", "-o", "%i"]).strip():
                time.sleep(1.0)  # a last file may still be landing
                if len([n for n in os.listdir(out) if n.startswith("r")]) < NRANKS:
                    raise RuntimeError(f"job ended with {len(names)}/{NRANKS} ranks reporting")
        time.sleep(0.005)
    raise RuntimeError(f"only {len(os.listdir(out))}/{NRANKS} rank files after {timeout:.0f} s")


# ----------------------------------------------------------------------------- methods
FLOOR_SCRIPT = """#!/bin/bash
#SBATCH -N {nodes} --ntasks-per-node={tpn} --cpus-per-task=1 -o {log}
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 12000))
srun {py} {prog} {out}
"""


def launch_floor(out: Path, work: Path) -> Submitted:
    """The floor: a hand-written batch script, one srun step, no launcher in between."""
    script = work / "job.sh"
    script.write_text(
        FLOOR_SCRIPT.format(
            nodes=NODES,
            tpn=TASKS_PER_NODE,
            log=shlex.quote(str(work / "slurm-%j.out")),
            py=shlex.quote(PY),
            prog=shlex.quote(str(RANK_TIME)),
            out=shlex.quote(str(out)),
        )
    )
    t0 = time.time()
    job_id = sh(["sbatch", "--parsable", str(script)], cwd=work).strip().split(";")[0]
    return Submitted(job_id, t0, time.time() - t0)


def hpclaunch_argv() -> tuple[list[str], dict[str, str]]:
    """The installed `hpclaunch` script, else the package from src/ (no shim either way)."""
    exe = BINDIR / "hpclaunch"
    if exe.exists():
        return [str(exe)], {}
    code = "import sys; from hpclaunch.cli.main import main; sys.exit(main())"
    return [PY, "-c", code], {"PYTHONPATH": str(ROOT / "src")}


# A GPU job: the testbed's 2 fake GPUs per node, and the nvidia-smi stand-in on the nodes'
# PATH, so that the GPU watch really samples (its nvidia-smi loop) beside the ranks.
GPU_PATTERN = SCRATCH / "gpu-pattern.json"
GPU_ARGS = [
    "--gpus-per-node", "2", "--setup", f"export PATH={ROOT}/tests/doubles/gpu:$PATH",
    "--env", f"HPCLAUNCH_FAKE_GPU_PATTERN={GPU_PATTERN}",
]  # fmt: skip
WATCH, NO_WATCH = "hpclaunch srun GPUs watch", "hpclaunch srun GPUs --no-watch"


def launch_hpclaunch(
    launcher: str, extra: tuple[str, ...] = ()
) -> Callable[[Path, Path], Submitted]:
    def launch(out: Path, work: Path) -> Submitted:
        base, extra_env = hpclaunch_argv()
        argv = [*base, "run", "-N", str(NODES), "--tasks-per-node", str(TASKS_PER_NODE)]
        argv += ["--launcher", launcher, "--cluster", "slurm", "--json", *extra]
        argv += ["--", PY, str(RANK_TIME), str(out)]
        env = {**os.environ, **extra_env, "XDG_DATA_HOME": str(SCRATCH / "xdg")}
        t0 = time.time()
        p = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
        cmd_s = time.time() - t0
        if p.returncode != 0:
            raise RuntimeError(f"hpclaunch run exited {p.returncode}: {p.stderr.strip()[-800:]}")
        rec = parse_json_object(p.stdout)
        return Submitted(str(rec["job_id"]), t0, cmd_s, str(rec.get("run_dir", "")))

    return launch


def parse_json_object(text: str) -> dict[str, object]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:  # tolerate lines printed before the object
        obj = json.loads(text[text.index("{") :])
    if not isinstance(obj, dict) or "job_id" not in obj:
        raise RuntimeError(f"no job_id in hpclaunch --json output: {text[:300]!r}")
    return obj


def submitit_rank(out_dir: str, bench_dir: str) -> None:
    """Runs on every submitit task (pickled by value, as it lives in __main__)."""
    t_start = time.time()
    import submitit.helpers

    submitit.helpers.TorchDistributedEnvironment().export()
    sys.path.insert(0, bench_dir)
    import rank_time

    rank_time.record(out_dir, t_start)


def launch_submitit(out: Path, work: Path) -> Submitted:
    import submitit

    ex = submitit.AutoExecutor(folder=str(work / "submitit"), cluster="slurm")
    ex.update_parameters(
        nodes=NODES,
        tasks_per_node=TASKS_PER_NODE,
        cpus_per_task=1,
        timeout_min=5,
        slurm_partition=default_partition(),
    )
    t0 = time.time()
    job = ex.submit(submitit_rank, str(out), str(BENCH))
    return Submitted(str(job.job_id), t0, time.time() - t0)


def launch_torchx(out: Path, work: Path) -> Submitted:
    argv = [tool("torchx"), "run", "-s", "slurm", "-cfg", f"partition={default_partition()}"]
    argv += ["dist.ddp", "-j", f"{NODES}x{TASKS_PER_NODE}", "--script", str(RANK_TIME), str(out)]
    t0 = time.time()
    p = subprocess.run(argv, cwd=work, capture_output=True, text=True)
    cmd_s = time.time() - t0
    # torchx's CLI calls `sacct` right after sbatch; with accounting disabled (the
    # testbed) that fails and the CLI exits 1 after a successful submit: accept it
    # when the app handle was printed.
    m = re.search(r"slurm://[^/\s]*/(\d+)", p.stdout + p.stderr)
    if not m:
        raise RuntimeError(f"torchx exited {p.returncode}: {(p.stdout + p.stderr)[-800:]}")
    return Submitted(m.group(1), t0, cmd_s)


METHODS: dict[str, Callable[[Path, Path], Submitted]] = {
    "hpclaunch srun": launch_hpclaunch("srun"),
    "hpclaunch torchrun": launch_hpclaunch("torchrun"),
    WATCH: launch_hpclaunch("srun", tuple(GPU_ARGS)),
    NO_WATCH: launch_hpclaunch("srun", (*GPU_ARGS, "--no-watch")),
    "sbatch+srun (floor)": launch_floor,
    "submitit": launch_submitit,
    "torchx": launch_torchx,
}


# ----------------------------------------------------------------------------- one rep
def run_once(name: str, rep: int) -> dict[str, float]:
    """Launch one job with `name` on an idle cluster and return its metrics."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    work = fresh(SCRATCH / f"{slug}-{rep}")
    out = fresh(work / "out")
    wait_idle()
    sub = METHODS[name](out, work)
    try:
        rows = wait_ranks(out)
    except RuntimeError as e:
        cancel_all()
        where = f" (run dir {sub.run_dir})" if sub.run_dir else f" (work dir {work})"
        raise RuntimeError(f"job {sub.job_id}: {e}{where}") from e
    t_alloc = alloc_time(sub.job_id)
    starts = [float(r[0]) for r in rows]
    inits = [float(r[2]) for r in rows]
    hosts = {r[4] for r in rows}
    if {r[3] for r in rows} != {str(NRANKS)} or len(hosts) != NODES:
        raise RuntimeError(f"job {sub.job_id}: unexpected world/hosts {rows}")
    if not sub.t_submit - 1.0 <= t_alloc <= min(starts):
        print(f"  warning: job {sub.job_id} allocation time outside submit..start (TZ?)")
    wait_idle()
    return {
        "a_alloc_to_user": max(starts) - t_alloc,
        "b_alloc_to_init": max(inits) - t_alloc,
        "c_submit_cmd": sub.cmd_s,
        "submit_to_alloc": t_alloc - sub.t_submit,
    }


def run_all(names: list[str], reps: int) -> dict[str, Series]:
    """Interleave the methods rep by rep (drift hits all alike); rep 0 is a warm-up."""
    methods = {name: (lambda rep, n=name: run_once(n, rep)) for name in names}
    got = h.interleave(methods, reps, max_errors=MAX_ERRORS, progress=h.print_metrics)
    return {n: Series(h.columns(got.kept[n]), got.errors[n]) for n in names}


# ----------------------------------------------------------------------------- bootstrap
def bench_bootstrap(runs: int) -> dict[str, list[float]]:
    """Per-rank cost of the bootstrap: `python -I -S bootstrap.py PROG` vs `PROG`, the
    bootstrap shipped as a run directory holds it (the loader beside the bootstrap
    module, whose bytecode is cached after the first start)."""
    shipped = fresh(SCRATCH / "bootstrap-run-dir")
    for source in (node.LOADER, node.BOOTSTRAP):  # the run folder's layout (launching)
        shutil.copyfile(node.path(source), shipped / node.RUN_DIR_NAME[source])
    boot = [PY, *node.PYTHON_FLAGS, str(shipped / node.RUN_DIR_NAME[node.LOADER])]
    pyc = [PY, "-c", "pass"]
    cmds = {"true": ["true"], "boot true": [*boot, "true"], "python -c pass": pyc}
    cmds["boot python -c pass"] = [*boot, *pyc]
    logdir = fresh(SCRATCH / "bootstrap-logs")
    with_logs = {"boot+logs true": [*boot, "true"], "boot+logs python -c pass": [*boot, *pyc]}
    times = h.start_times(cmds, runs, SCRATCH)
    # As in a real task: logs and the run's events.jsonl (HPCLAUNCH_RUN_DIR).
    logs_env = {"HPCLAUNCH_LOG_DIR": str(logdir), "HPCLAUNCH_RUN_DIR": str(logdir)}
    times.update(h.start_times(with_logs, runs, SCRATCH, {**os.environ, **logs_env}))
    return times


# ----------------------------------------------------------------------------- report
def paired(series: dict[str, Series], a: str, b: str, key: str) -> tuple[float, float, float]:
    """a - b over the reps both have (methods are interleaved rep by rep, so a rep's pair
    saw the same machine): the median, and the 2nd smallest and 2nd largest difference,
    a sign-test interval for the median (87% with 7 pairs, more with more); NaN when
    fewer than 5 reps pair up."""
    xs = series[a].samples.get(key, []) if a in series else []
    ys = series[b].samples.get(key, []) if b in series else []
    return h.paired_difference(xs, ys)


def results_table(series: dict[str, Series]) -> list[str]:
    head = ["method", "(a) alloc → last rank in user code", "(b) alloc → last rank past init"]
    head += ["(c) submit command", "submit → alloc (scheduler)", "n"]
    rows = []
    for name, s in series.items():
        if s.error and not s.samples:
            rows.append([name, f"failed: {s.error[:160]}", "", "", "", "0"])
            continue
        g = s.samples.get
        n = str(len(g("a_alloc_to_user", [])))
        if s.errors:
            n += f" ({len(s.errors)} failed)"
        keys = ("a_alloc_to_user", "b_alloc_to_init", "c_submit_cmd", "submit_to_alloc")
        rows.append([name, *(h.fmt(g(k)) for k in keys), n])
    return h.table(head, rows)


def bootstrap_table(boot: dict[str, list[float]]) -> list[str]:
    rows = [[f"`{k}`", h.fmt(v, "ms"), str(len(v))] for k, v in boot.items()]
    return h.table(["command", "wall per start", "n"], rows)


def targets(
    series: dict[str, Series], boot: dict[str, list[float]], startup_rows: list[dict[str, Any]]
) -> list[str]:
    """PASS/MISS lines against the design targets (reported, never asserted)."""
    out: list[str] = []

    def verdict(ok: bool, text: str) -> None:
        out.append(h.verdict(ok, text))

    def m(name: str, key: str) -> float:
        return h.median(series[name].samples.get(key)) if name in series else h.NAN

    srun_a, floor_a = (
        m("hpclaunch srun", "a_alloc_to_user"),
        m("sbatch+srun (floor)", "a_alloc_to_user"),
    )
    verdict(
        srun_a <= floor_a + TARGET_SRUN_OVER_FLOOR,
        f"srun launcher (a) {srun_a * 1e3:.0f} ms <= floor (a) {floor_a * 1e3:.0f} ms + 24 ms "
        f"(+{(srun_a - floor_a) * 1e3:.0f} ms; aiming at +15 ms)",
    )
    for key, what in (("a_alloc_to_user", "(a)"), ("b_alloc_to_init", "(b)")):
        diff, low, high = paired(series, WATCH, NO_WATCH, key)
        same = low <= 0 <= high
        verdict(
            same,
            f"GPU watch on vs --no-watch, {what}: {diff * 1e3:+.0f} ms, the median of the "
            f"reps' paired differences; the 2nd smallest to 2nd largest difference "
            f"({low * 1e3:+.0f} to {high * 1e3:+.0f} ms) "
            + ("holds 0: no change the noise does not explain" if same else "excludes 0"),
        )
    for name in ("hpclaunch srun", "hpclaunch torchrun"):
        c = m(name, "c_submit_cmd")
        verdict(c <= TARGET_RUN_CMD, f"`hpclaunch run` (c) with {name}: {c:.3f} s <= 0.3 s")
    for prog in ("true", "python -c pass"):
        for kind in ("boot", "boot+logs"):
            extra = h.median(boot.get(f"{kind} {prog}")) - h.median(boot.get(prog))
            verdict(
                extra <= TARGET_BOOTSTRAP,
                f"{kind} over direct `{prog}`: +{extra * 1e3:.1f} ms <= 10 ms per rank",
            )
    for row in startup_rows:
        if row["case"] in ("dry-run", "submit") and row["venv"] == "heavy":
            t = row["median_s"]
            verdict(t <= TARGET_STARTUP, f"{row['case']} in the heavy venv: {t:.3f} s <= 0.2 s")
    return out


def machine_facts() -> dict[str, str]:
    facts = h.machine_facts(slurm=True, interpreter=PY, user=True)
    return {**facts, **{mod: h.module_version(mod) for mod in ("torch", "submitit", "torchx")}}


def doc_section(body: list[str], facts: dict[str, str], reps: int) -> str:
    return h.section(
        "launch",
        "Launch cost on the Slurm testbed (`bench/launch.py`)",
        [
            f"Measured {facts['date']}; {h.facts_line(facts)}. Jobs were submitted as "
            f"{facts['user']}. The two testbed "
            "nodes share this machine's CPUs. Median (min-max) over n reps after one "
            "discarded warm-up; each rep starts on an idle cluster. The program is "
            "`bench/rank_time.py` (2 nodes x 2 tasks, `import torch`, gloo init).",
            "",
            *body,
            "",
            *h.reproduce(
                "bash scripts/setup.sh --test && .venv/bin/pip install -e '.[bench]'",
                "sudo apt-get install -y hyperfine  # the bootstrap rows (without it: a Python "
                "loop)",
                'export "$(sudo bash testbed/up.sh | tail -n 1)"  # (re)starts the testbed',
                f"REPS={reps} PATH=$PWD/.venv/bin:$PATH .venv/bin/python bench/launch.py",
            ),
        ],
    )


# ----------------------------------------------------------------------------- main
QUICK_METHODS = "hpclaunch srun,sbatch+srun (floor)"


def parse_args() -> argparse.Namespace:
    p = h.arguments("hpclaunch launch-cost benchmark (Slurm testbed)", reps=7)
    p.add_argument("--no-startup", action="store_true", help="skip the lean/heavy venv part")
    p.add_argument("--methods", default=",".join(METHODS), help="comma list of method names")
    p.add_argument("--boot-runs", type=int, default=50, help="hyperfine runs per command")
    args = h.parse(p)
    if args.quick:
        args.methods, args.boot_runs, args.no_startup = QUICK_METHODS, 5, True
    return args


def measure(
    names: list[str], reps: int, boot_runs: int, startup_part: bool = True
) -> dict[str, object]:
    """Run everything on the testbed; the result is what bench/results/launch.json holds."""
    cluster.ensure_cluster()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    GPU_PATTERN.write_text(json.dumps({"gpus": [{"samples": [[97, 40000, 600.0]]}]}))
    wait_idle()
    stall = dns_stall_s()
    if stall > 0.5:
        print(f"warning: a reverse DNS lookup on a node takes >= {stall:.1f} s; (b) includes it")
    series = run_all(names, reps)
    boot = bench_bootstrap(boot_runs) if BOOTSTRAP.exists() else {}
    launch = {n: {"samples": s.samples, "errors": s.errors} for n, s in series.items()}
    facts = machine_facts()
    rows: list[dict[str, Any]] = []
    if startup_part:
        import startup  # bench/startup.py, beside this file

        rows = startup.measure(reps)
        facts["venvs"] = startup.describe()
    return {
        "facts": facts,
        "reps": reps,
        "dns_stall_s": stall,
        "launch": launch,
        "boot": boot,
        "startup": rows,
    }


def render(data: dict[str, Any]) -> list[str]:
    """The markdown body (tables, caveats, targets) from measure()'s result."""
    series = {n: Series(v["samples"], v["errors"]) for n, v in data["launch"].items()}
    boot: dict[str, list[float]] = data["boot"]
    body = ["### Launch, 2 nodes x 2 tasks", "", *results_table(series), ""]
    body += [
        "(c) is the whole process for hpclaunch, torchx and the floor's `sbatch --parsable`; "
        "for submitit it is the in-process `submit()` call (no interpreter start).",
        "",
    ]
    if data["dns_stall_s"] > 0.5:
        body += [
            f"Caveat: on these nodes a reverse DNS lookup of an IPv4-mapped address did not "
            f"finish within {data['dns_stall_s']:.1f} s (the probe's limit; glibc gives up "
            "after 2 x 5 s): the node namespaces route to a DNS server they cannot reach. "
            "c10d makes such lookups while connecting (TCPStore, torchrun's rendezvous), so "
            "(b), and (a) for the torchrun-based methods, carry 10 s steps of DNS timeouts.",
            "",
        ]
    if boot:
        body += ["### Bootstrap per rank (hyperfine -N, warm cache)", "", *bootstrap_table(boot)]
        body += [
            "",
            "`boot` = `python -I -S RUN_DIR/bootstrap.py PROG` as a run directory holds it "
            "(the loader, which imports the bootstrap from bytecode cached at the first "
            "start); `boot+logs` adds `HPCLAUNCH_LOG_DIR` and `HPCLAUNCH_RUN_DIR` "
            "(ranks.tsv, per-rank log files, exit record, rank_start/rank_end events).",
        ]
    else:
        body += [f"Bootstrap not measured: {BOOTSTRAP} is missing."]
    rows = data.get("startup") or []
    if rows:
        import startup

        body += ["", "### Start-up of `hpclaunch` in a lean and a heavy venv", ""]
        body += [startup.table(rows), ""]
        body += [
            "lean = hpclaunch alone; heavy = plus torch 2.13, lightning, jax[cpu] and wandb "
            f"({data['facts'].get('venvs', '')}). Whole processes, median (min-max).",
        ]
    body += ["", "### Targets", "", *[f"- {t}" for t in targets(series, boot, rows)]]
    return body


def main() -> int:
    args = parse_args()
    names = [n.strip() for n in args.methods.split(",") if n.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; known: {list(METHODS)}")
    saved = RESULTS / "launch.json"
    data = h.results(
        args, saved, lambda: measure(names, args.reps, args.boot_runs, not args.no_startup)
    )
    h.publish(args, "launch", doc_section(render(data), data["facts"], data["reps"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
