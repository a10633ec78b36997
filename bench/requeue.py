"""Requeue turnaround on the Slurm testbed (a harness, not a test).

One job, 2 nodes x 1 task, time limit 1 minute, is signalled SIGNAL_BEFORE (25) s before
its limit, its ranks save (nothing) and exit, the batch shell requeues it and the next
attempt's ranks start and finish at once. Two ways, interleaved rep by rep, the same
program (bench/requeue_prog.py):

  hpclaunch     `hpclaunch run -N 2 --tasks-per-node 1 -t 1 --requeue --signal-before 25`
  hand-written  bench/requeue_handwritten.sh: `#SBATCH --requeue --signal=B:USR2@25`,
                srun in the background, a trap passing USR2 to srun, wait,
                `scontrol requeue $SLURM_JOB_ID`

Per rep, as median (min-max):

  (1) signal -> last rank exited: the batch shell's trap (hpclaunch's "signal" event, the
      script's own stamp) to the last rank's stamp just before it exits
  (2) last rank exited -> `scontrol requeue` (slurmctld's "Requeuing JobId=N")
  (3) Slurm's part: requeue -> allocation of the next attempt (slurmctld's log)
  (4) that allocation -> last rank of the next attempt in user code (its first line)

The launcher's part is (1) + (2) + (4) minus the program's own exit time (signal received
-> exit stamp); the target is hpclaunch's <= the hand-written script's + 1 s. slurmctld
logs with ms resolution; the testbed's nodes share this machine's clock.

    export "$(bash testbed/up.sh | tail -n 1)"  # or SLURM_CONF=<the running testbed's>
    flock /var/tmp/hpclaunch-testbed.lock env REPS=3 .venv/bin/python bench/requeue.py

Why 25 s and not 30: slurmctld checks time limits on a 30 s tick and sends the signal at
the first tick where the time left is <= signal-before + 30 s (send_job_warn_signal).
With -t 1 and 30 s that holds from the start, so every attempt, the next one included,
is signalled at its first tick, which can come a fraction of a second after it starts
(backfill starts the requeued job in phase with the tick): its ranks die of the signal
before they install a handler and the job is requeued again. With 25 s the first 5 s of
an attempt are safe, and the first attempt is signalled 5-35 s after it starts.

A rep takes about a minute per method (the signal 5-35 s in, then the requeued job waits
out `AuthInfo=cred_expire` + 1 s, 11 s on the testbed, and the next backfill pass). No
rep is started once BUDGET_S (default 660) would be overrun.

Options (bench/harness.py's): --reps (REPS, default 3), --quick (1 rep), --no-doc
(NO_DOC=1), --doc FILE, --render-only (RENDER_ONLY=1; from bench/results/requeue.json).
Environment: SIGNAL_BEFORE (default 25), BUDGET_S (default 660), SLURM_CONF (when unset,
the running testbed's), BENCH_SCRATCH (a folder every node sees, default /var/tmp/hpclaunch-bench),
HPCLAUNCH_TESTBED_STATE (default /var/tmp/hpclaunch-testbed). Jobs are submitted as the
calling user.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import cluster  # bench/ is on sys.path when run as a script
import harness as h
from cluster import BINDIR, PY, queue, sh
from harness import fresh

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PROG = BENCH / "requeue_prog.py"
HANDWRITTEN = BENCH / "requeue_handwritten.sh"
RESULTS = BENCH / "results"
SAVED = RESULTS / "requeue.json"
STATE = Path(os.environ.get("HPCLAUNCH_TESTBED_STATE", "/var/tmp/hpclaunch-testbed"))
CTLD_LOG = STATE / "log" / "slurmctld.log"
SCRATCH = Path(os.environ.get("BENCH_SCRATCH", "/var/tmp/hpclaunch-bench")) / "requeue"
NODES, TASKS_PER_NODE = 2, 1
NRANKS = NODES * TASKS_PER_NODE
TIME_LIMIT = "1"  # minutes, as -t takes it
TARGET_OVER_HAND_S = 1.0
JOB_TIMEOUT_S = 300.0  # one job, both attempts; a 1-minute limit and a ~45 s requeue wait
REFERENCE = (
    "~3 minutes from requeue to restart on a production cluster (the log in a submitit "
    "pull request; the only published figure found)"
)
METHODS = ("hpclaunch", "hand-written")

# Columns of the main table: key, heading.
COLUMNS = (
    ("s1_signal_to_exit", "(1) signal → last rank exited"),
    ("s2_exit_to_requeue", "(2) → `scontrol requeue`"),
    ("s3_slurm", "(3) Slurm: requeue → next allocation"),
    ("s4_alloc_to_user", "(4) allocation → last rank in user code"),
    ("part", "launcher's part (1)+(2)+(4)−own"),
    ("total", "signal → user code of the next attempt"),
)
# The breakdown table.
DETAILS = (
    ("alloc_to_signal", "first allocation → signal (Slurm's tick)"),
    ("forward", "signal → last rank received it"),
    ("own", "program's own exit (received → exit stamp)"),
    ("s2a_exit_to_decision", "last rank exited → shell's requeue decision"),
    ("s2b_scontrol", "decision → slurmctld logs the requeue"),
    ("alloc_to_shell", "allocation → batch shell of the next attempt"),
    ("shell_to_user", "batch shell → last rank in user code"),
)


# ----------------------------------------------------------------------------- cluster
def ensure_cluster() -> None:
    """The testbed's clients; jobs inherit our environment: no rank variables and no
    attempt of our own."""
    attempt = ("HPCLAUNCH_ATTEMPT", "SLURM_RESTART_COUNT", "SLURM_JOB_ID")
    cluster.ensure_cluster(unset=(*cluster.RANK_VARS, *attempt))


def wait_idle() -> None:
    cluster.wait_idle(300.0, poll=0.5)


def log_size() -> int:
    return CTLD_LOG.stat().st_size


_STAMP = r"^\[(\S+)\] "


def ctld_times(job_id: str, offset: int) -> tuple[float, float, float]:
    """(first allocation, requeue, allocation after the requeue) from slurmctld's log,
    read from `offset` (the log's size before the submit: job ids of an earlier testbed
    never match)."""
    with open(CTLD_LOG, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    j = re.escape(job_id)
    alloc = re.compile(_STAMP + rf"sched\S*: (?:Allocate|_start_job: Started) JobId={j}[ (+]", re.M)
    requeue = re.compile(_STAMP + rf"Requeuing JobId={j}\b", re.M)
    a0 = alloc.search(text)
    rq = requeue.search(text)
    if not a0 or not rq:
        raise RuntimeError(f"job {job_id}: no allocation or no requeue line in {CTLD_LOG}")
    a1 = alloc.search(text, rq.end())
    if not a1:
        raise RuntimeError(f"job {job_id}: no allocation after the requeue in {CTLD_LOG}")

    def at(m: re.Match[str]) -> float:
        # slurmctld logs local time with ms ("2026-11-21T23:49:00.123").
        return dt.datetime.fromisoformat(m.group(1)).timestamp()

    return at(a0), at(rq), at(a1)


# ----------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class Submitted:
    job_id: str
    run_dir: Path | None = None  # hpclaunch's run directory (events.jsonl)
    events: Path | None = None  # the hand-written script's stamps


@dataclass(frozen=True)
class Stamps:
    """The batch shell's times: attempt 0's trap and requeue decision, attempt 1's start."""

    signal: float
    decision: float
    shell1: float


def submit_hpclaunch(out: Path, work: Path, before: int) -> Submitted:
    exe = BINDIR / "hpclaunch"
    if exe.exists():
        base, extra_env = [str(exe)], {}
    else:
        code = "import sys; from hpclaunch.cli.main import main; sys.exit(main())"
        base, extra_env = [PY, "-c", code], {"PYTHONPATH": str(ROOT / "src")}
    argv = [*base, "run", "--cluster", "slurm", "-N", str(NODES)]
    argv += ["--tasks-per-node", str(TASKS_PER_NODE), "-t", TIME_LIMIT, "--requeue"]
    argv += ["--signal-before", str(before), "--run-root", str(work / "runs"), "--no-snapshot"]
    argv += ["--json", "--", PY, str(PROG), str(out)]
    env = {**os.environ, **extra_env, "XDG_DATA_HOME": str(work / "xdg")}
    p = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"hpclaunch run exited {p.returncode}: {p.stderr.strip()[-800:]}")
    rec = json.loads(p.stdout[p.stdout.index("{") :])
    return Submitted(str(rec["job_id"]), run_dir=Path(rec["run_dir"]))


def submit_hand(out: Path, work: Path, before: int) -> Submitted:
    events = work / "events.txt"
    argv = ["sbatch", "--parsable", "-N", str(NODES), f"--ntasks-per-node={TASKS_PER_NODE}"]
    argv += ["--cpus-per-task=1", "-t", TIME_LIMIT, f"--signal=B:USR2@{before}"]
    argv += ["-o", str(work / "slurm-%j.out"), str(HANDWRITTEN), str(events), PY, str(PROG)]
    argv += [str(out)]
    job_id = sh(argv, cwd=work).strip().split(";")[0]
    return Submitted(job_id, events=events)


SUBMIT: dict[str, Callable[[Path, Path, int], Submitted]] = {
    "hpclaunch": submit_hpclaunch,
    "hand-written": submit_hand,
}


def stamps(sub: Submitted) -> Stamps:
    """The batch shell's own stamps, from events.jsonl or the script's events file."""
    if sub.run_dir is not None:
        evs = [json.loads(ln) for ln in (sub.run_dir / "events.jsonl").read_text().splitlines()]

        def one(pred: Callable[[dict[str, Any]], bool], what: str) -> float:
            hits = [float(e["time"]) for e in evs if pred(e)]
            if len(hits) != 1:
                raise RuntimeError(f"{sub.run_dir}/events.jsonl: {len(hits)} {what} events")
            return hits[0]

        return Stamps(
            signal=one(lambda e: e["event"] == "signal" and e["attempt"] == 0, "signal"),
            decision=one(
                lambda e: e["event"] == "attempt_end" and e.get("reason") == "requeued",
                "attempt_end requeued",
            ),
            shell1=one(lambda e: e["event"] == "attempt_start" and e["attempt"] == 1, "start 1"),
        )
    assert sub.events is not None
    rows = [ln.split() for ln in sub.events.read_text().splitlines()]
    got = {(r[0], r[1]): float(r[2]) for r in rows}
    try:
        return Stamps(got[("signal", "0")], got[("requeue", "0")], got[("start", "1")])
    except KeyError as e:
        raise RuntimeError(f"{sub.events}: no {e} stamp ({rows})") from e


# ----------------------------------------------------------------------------- one rep
def wait_done(job_id: str, out: Path, timeout: float = JOB_TIMEOUT_S) -> None:
    """Until the next attempt's ranks reported and the job left the queue."""
    deadline, next_check = time.time() + timeout, time.time() + 10.0
    while time.time() < deadline:
        done = all((out / f"a1-r{r}-start").exists() for r in range(NRANKS))
        if done or time.time() > next_check:  # squeue seldom: it costs slurmctld CPU
            next_check = time.time() + 10.0
            if job_id not in queue():
                if not done:
                    time.sleep(1.0)  # a last file may still be landing
                    done = all((out / f"a1-r{r}-start").exists() for r in range(NRANKS))
                if done:
                    return
                raise RuntimeError(
                    f"job {job_id} ended without attempt 1's ranks: {os.listdir(out)}"
                )
        time.sleep(0.25 if not done else 0.5)
    subprocess.run(["scancel", job_id], capture_output=True)
    raise RuntimeError(f"job {job_id} not done after {timeout:.0f} s: {os.listdir(out)}")


def run_once(name: str, rep: int, before: int) -> dict[str, float]:
    """One job of `name` on an idle cluster, signal to the next attempt; its metrics."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    work = fresh(SCRATCH / f"{slug}-{rep}")
    out = fresh(work / "out")
    wait_idle()
    offset = log_size()
    sub = SUBMIT[name](out, work, before)
    where = f"run dir {sub.run_dir}" if sub.run_dir else f"work dir {work}"
    try:
        wait_done(sub.job_id, out)
        alloc0, t_requeue, alloc1 = ctld_times(sub.job_id, offset)
        st = stamps(sub)
        sig = [
            [float(x) for x in (out / f"a0-r{r}-signal").read_text().split()] for r in range(NRANKS)
        ]
        start1 = [float((out / f"a1-r{r}-start").read_text()) for r in range(NRANKS)]
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        subprocess.run(["scancel", sub.job_id], capture_output=True)
        raise RuntimeError(f"{name} job {sub.job_id}: {e} ({where})") from e
    received, exited = max(s[1] for s in sig), max(s[2] for s in sig)
    own = max(s[2] - s[1] for s in sig)
    order = [alloc0, st.signal, received, exited, st.decision, t_requeue, alloc1, max(start1)]
    # ms log times against µs stamps: allow 2 ms of rounding.
    if any(b < a - 0.002 for a, b in zip(order, order[1:])):
        print(f"  warning: {name} job {sub.job_id}: times out of order {order} ({where})")
    m = {
        "s1_signal_to_exit": exited - st.signal,
        "s2_exit_to_requeue": t_requeue - exited,
        "s3_slurm": alloc1 - t_requeue,
        "s4_alloc_to_user": max(start1) - alloc1,
        "alloc_to_signal": st.signal - alloc0,
        "forward": received - st.signal,
        "own": own,
        "s2a_exit_to_decision": st.decision - exited,
        "s2b_scontrol": t_requeue - st.decision,
        "alloc_to_shell": st.shell1 - alloc1,
        "shell_to_user": max(start1) - st.shell1,
        "total": max(start1) - st.signal,
    }
    m["part"] = m["s1_signal_to_exit"] + m["s2_exit_to_requeue"] + m["s4_alloc_to_user"] - own
    print(
        f"  rep {rep} {name} job {sub.job_id}: part {m['part']:.3f} s = "
        f"(1) {m['s1_signal_to_exit']:.3f} + (2) {m['s2_exit_to_requeue']:.3f} + "
        f"(4) {m['s4_alloc_to_user']:.3f} - own {own:.4f}; Slurm (3) {m['s3_slurm']:.3f} s",
        flush=True,
    )
    return m


def measure(reps: int, before: int, budget_s: float) -> dict[str, Any]:
    """Interleave the methods rep by rep (alternating which goes first)."""
    ensure_cluster()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    methods = {name: (lambda rep, n=name: run_once(n, rep, before)) for name in METHODS}
    got = h.interleave(
        methods, reps, warmup=0, order=h.ALTERNATE, catch=(RuntimeError,), budget_s=budget_s
    )
    wait_idle()
    print(f"measured in {time.time() - t0:.0f} s", flush=True)
    return {
        "facts": machine_facts(),
        "reps": reps,
        "skipped": got.skipped,
        "signal_before": before,
        "samples": {name: h.columns(got.kept[name]) for name in METHODS},
        "errors": got.errors,
    }


# ----------------------------------------------------------------------------- report
def machine_facts() -> dict[str, str]:
    conf = Path(os.environ.get("SLURM_CONF", STATE / "slurm.conf"))
    m = re.search(r"cred_expire=(\d+)", conf.read_text()) if conf.exists() else None
    facts = h.machine_facts(slurm=True, interpreter=PY, user=True)
    return {**facts, "cred_expire": m.group(1) if m else "120 (default)"}


def tables(data: dict[str, Any]) -> list[str]:
    samples: dict[str, dict[str, list[float]]] = data["samples"]
    errors: dict[str, list[str]] = data["errors"]

    def n(name: str) -> str:
        k = str(len(samples[name].get("part", [])))
        return k + (f" ({len(errors[name])} failed)" if errors[name] else "")

    rows = [[name, *(h.fmt(samples[name].get(k)) for k, _ in COLUMNS), n(name)] for name in METHODS]
    lines = h.table(["method", *(head for _, head in COLUMNS), "n"], rows)
    lines += ["", "Breakdown:", ""]
    details = [[head, *(h.fmt(samples[m].get(k)) for m in METHODS)] for k, head in DETAILS]
    lines += h.table(["", *METHODS], details)
    for name in METHODS:
        for e in errors[name]:
            lines.append(f"\n{name} failed: {e[:300].replace('|', '/')}")
    return lines


def targets(data: dict[str, Any]) -> list[str]:
    s = data["samples"]
    ours, hand = h.median(s["hpclaunch"].get("part")), h.median(s["hand-written"].get("part"))
    text = (
        f"hpclaunch's part {ours:.3f} s <= the hand-written script's {hand:.3f} s + 1 s "
        f"({ours - hand:+.3f} s)"
    )
    return [h.verdict(ours <= hand + TARGET_OVER_HAND_S, text)]


def render(data: dict[str, Any]) -> list[str]:
    f = data["facts"]
    cred = f["cred_expire"]
    body = [
        f"### Signal to the next attempt, {NODES} nodes x {TASKS_PER_NODE} task, -t 1, "
        f"signal {data['signal_before']} s before the limit",
        "",
        *tables(data),
        "",
        f"Slurm's part (3) is the requeued job's wait: Slurm sets its begin time to the "
        f"requeue + `AuthInfo=cred_expire` + 1 s ({cred} s on this testbed; 120 s by "
        "default) and starts it on the next scheduler or backfill pass after that. "
        f"For reference: {REFERENCE}, which is what the default 121 s plus a scheduler pass "
        "gives. The signal comes on slurmctld's 30 s time-limit tick, the first where the "
        "time left is <= signal-before + 30 s: 0-30 s before the asked time (first "
        "allocation → signal). With -t 1 and 30 s that is every attempt's first tick, which "
        "can come a fraction of a second into the next attempt (seen on this testbed: its "
        "ranks died of the signal before installing a handler and the job was requeued "
        f"again), hence {data['signal_before']} s.",
        "",
        "### Targets",
        "",
        *[f"- {t}" for t in targets(data)],
    ]
    if data.get("skipped"):
        body += [f"- {data['skipped']} rep(s) not run: the time budget was spent"]
    return body


def doc_section(body: list[str], data: dict[str, Any]) -> str:
    f = data["facts"]
    facts = ", ".join(f"{k} {f[k]}" for k in ("nproc", "kernel", "slurm", "python"))
    return h.section(
        "requeue",
        "Requeue turnaround on the Slurm testbed (`bench/requeue.py`)",
        [
            f"Measured {f['date']}; {facts}. Jobs were submitted as {f['user']}; the two "
            "testbed nodes share this machine's CPUs and clock. Median (min-max) over n "
            "reps, the two methods interleaved in each rep, each job on an idle cluster. "
            "The program (`bench/requeue_prog.py`, the same for both) exits 0 in its "
            "SIGUSR2 handler on the first attempt and at once on the next; the hand-written "
            "script is `bench/requeue_handwritten.sh`. Signal times are the batch shell's "
            "trap (hpclaunch's `signal` event, the script's own stamp), requeue and "
            "allocation times slurmctld's log (ms), rank times the program's own "
            "`time.time()`.",
            "",
            *body,
            "",
            *h.reproduce(
                'export "$(sudo bash testbed/up.sh | tail -n 1)"  # (re)starts the testbed',
                f"flock /var/tmp/hpclaunch-testbed.lock env REPS={data['reps']} "
                ".venv/bin/python bench/requeue.py",
            ),
        ],
    )


def main() -> int:
    args = h.parse(h.arguments(__doc__.splitlines()[0], reps=3))
    before = int(os.environ.get("SIGNAL_BEFORE", "25"))
    budget = float(os.environ.get("BUDGET_S", "660"))
    data = h.results(args, SAVED, lambda: measure(args.reps, before, budget))
    h.publish(args, "requeue", doc_section(render(data), data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
