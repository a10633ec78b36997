"""hpclaunch GPU watch: samples a node's GPUs beside the ranks, and says when they starve.

Shipped (rules: hpclaunch/node/__init__.py): stdlib, python3 >= 3.6, -I -S; the host imports
it too. One per node at nice 10: ``gpu_watch.py --out RUN/metrics/gpu-{node}.csv [--warn]
[--interval 2] [--events FILE] [--window 120] [--warmup 60] [--stop-file P] [--pid PID]``.

Its tool, the first found on PATH then in /opt/rocm/bin: nvidia-smi (its loop, -lms),
rocm-smi or amd-smi (a call per sample; JSON keys matched loosely: ROCm renames them).
With none, the job's first node says so on stderr; exit 0. The CSV, appended (a header,
one write per sample): time (Unix), node, gpu (the tool's index), busy_pct (% of time a
kernel ran), mem_mib (memory used), power_w (W; an MI250X's on its even GCD); empty: none.

It stops on SIGUSR1 (the batch script's "the ranks are done"; srun passes it on),
SIGTERM, SIGINT, SIGHUP, once --stop-file exists, a --pid has left /proc or its parent
changed (checked each second). From --warmup s after its first sample it judges the last
--window s (analyze); the first verdict goes once to stderr (--warn) and to --events:
{"event": "input_bound", "node", "kind", "gpus": [[node, gpu, idle share]], "message"}.
"""

import argparse
import contextlib
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time
from subprocess import DEVNULL, PIPE
from typing import Any, NamedTuple, Optional

PREFIX = "hpclaunch: gpu watch: "
HEADER = "time,node,gpu,busy_pct,mem_mib,power_w\n"
INPUT_BOUND = "input_bound"  # the event's name
TOOLS = ("nvidia-smi", "rocm-smi", "amd-smi")
NVIDIA_QUERY = "index,utilization.gpu,memory.used,power.draw"
ONE_SHOT = {
    "rocm-smi": ["--showuse", "--showpower", "--showmeminfo", "vram", "--json"],
    "amd-smi": ["metric", "--usage", "--power", "--mem-usage", "--json"],
}
INTERVAL_S, WINDOW_S, WARMUP_S = 2.0, 120.0, 60.0  # --interval, --window, --warmup
WINDOW_ENV, WARMUP_ENV = "HPCLAUNCH_WATCH_WINDOW", "HPCLAUNCH_WATCH_WARMUP"  # their defaults
ROCM_BIN = "/opt/rocm/bin"

# --- the input-bound verdict (analyze) over a window's samples
IDLE_BUSY_PCT = 10.0  # a sample is idle when the GPU was busy less than 10% of the time
# No busy %: idle when drawing < 30% of the node's hungriest GPU. Never for an MI250X
# secondary die (odd GCD with no power, or 0 W, while the even one before it has power).
IDLE_POWER_SHARE = 0.3
GPU_IDLE_SHARE = 0.5  # SOME_IDLE: a GPU idle in >= 50% of its samples ...
OTHERS_BUSY_SHARE = 0.5  # ... while the median GPU is busy (not idle) in >= 50% of its own
ALL_IDLE_SHARE = 0.8  # ALL_IDLE: the samples of all GPUs together >= 80% idle
MIN_SAMPLES = 5  # a GPU with fewer judged samples in the window is left out
SOME_IDLE, ALL_IDLE = "some_idle", "all_idle"  # Verdict.kind


class Row(NamedTuple):  # a line of the CSV; the parsers' have time 0 and node ""
    time: float
    node: str
    gpu: int
    busy_pct: Optional[float]
    mem_mib: Optional[float]
    power_w: Optional[float]


class Verdict(NamedTuple):
    kind: str  # SOME_IDLE or ALL_IDLE
    gpus: "list[tuple[str, int, float]]"  # the GPUs it names: (node, gpu, idle share)
    idle_share: float  # of the named GPUs' samples together
    span_s: float  # from the window's first sample to its last


def say(text: str, prefix: str = PREFIX) -> None:
    print(prefix + text, file=sys.stderr, flush=True)


def node_name(env: Any) -> str:
    # The bootstrap's rule too: the same node has the same name in every file of a run.
    return env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def number(value: Any) -> Optional[float]:
    """35, "35 %", "631.95 W" -> a number; "[N/A]", "N/A (Secondary die)", null -> None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    found = re.match(r"\s*(-?\d+(?:\.\d+)?)\s*[A-Za-z%]*\s*$", value if type(value) is str else "")
    return float(found.group(1)) if found else None


def parse_nvidia(text: str) -> "list[Row]":
    """nvidia-smi --query-gpu=NVIDIA_QUERY --format=csv,noheader,nounits: a line a GPU."""
    found = []
    for line in text.splitlines():
        parts = line.split(",")
        index = number(parts[0]) if len(parts) == 4 else None
        if index is not None:
            found.append(Row(0.0, "", int(index), *(number(p) for p in parts[1:])))
    return found


def _leaves(record: "dict[str, Any]", parent: str = "") -> "list[tuple[str, str, Any, str]]":
    """(parent words, words, value, unit) of one GPU's readings: "VRAM Total Used Memory
    (B)": V is ("", "vramtotalusedmemory", V, "b"); {"value": V, "unit": U} is one."""
    found = []
    for key, value in record.items():
        named = re.match(r"^(.*?)\s*\(([^()]*)\)\s*$", str(key))
        base, unit = (named.group(1), named.group(2).lower()) if named else (str(key), "")
        words = re.sub(r"[^a-z0-9]", "", base.lower())
        if isinstance(value, dict) and "value" in value:
            found.append((parent, words, value["value"], str(value.get("unit", unit)).lower()))
        elif isinstance(value, dict):
            found.extend(_leaves(value, words))
        else:
            found.append((parent, words, value, unit))
    return found


BUSY_WORDS = {"gpuuse", "gpuusage", "gpuutil", "gpuutilization", "gpubusy", "busypercent"}
MIB_PER = {"b": 1 / 1048576, "kb": 1 / 1024, "kib": 1 / 1024, "gb": 1024.0, "gib": 1024.0}
NOT_MEM = ("visible", "gtt", "percent")
NOT_POWER = ("max", "cap", "limit", "management", "default", "min", "throttle", "profile")


def _pick(leaves: "list[tuple[str, str, Any, str]]") -> "tuple[Any, Any, Any]":
    """(busy, mem_mib, power_w) of one GPU's readings, None where it has none."""
    busy = mem = power = None
    for parent, words, value, unit in leaves:
        # rocm-smi's "GFX Activity" counts; amd-smi's usage.gfx_activity (%) is busy %.
        gfx = words == "gfxactivity" and (unit == "%" or parent == "usage")
        used = "used" in words and ("vram" in words or "memory" in words) and "%" not in unit
        if busy is None and (words in BUSY_WORDS or gfx):
            busy = number(value)
        elif mem is None and used and not any(x in words for x in NOT_MEM):
            mib = number(value)
            mem = None if mib is None else mib * MIB_PER.get(unit, 1.0)
        elif power is None and "power" in words and not any(x in words for x in NOT_POWER):
            power = number(value)
    return busy, mem, power


def parse_json(text: str) -> "list[Row]":
    """rocm-smi --json ({"card0": {...}}) or amd-smi metric --json ([{"gpu": 0, ...}] or
    {"gpu_data": [...]}, values bare or {"value", "unit"}); text before the JSON skipped."""
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    try:
        data = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        return []
    if isinstance(data, dict) and isinstance(data.get("gpu_data"), list):
        data = data["gpu_data"]
    listed = [(i.get("gpu"), i) for i in data if isinstance(i, dict)] if type(data) is list else []
    records = []
    for key, record in data.items() if isinstance(data, dict) else listed:
        card = re.match(r"^(?:card)?(\d+)$", str(key).strip().lower())  # "card0" or 0
        if card and isinstance(record, dict):
            records.append((int(card.group(1)), record))
    return [Row(0.0, "", g, *_pick(_leaves(record))) for g, record in sorted(records)]


def csv_lines(rows: "list[Row]") -> str:
    def text(value: Optional[float]) -> str:
        return "" if value is None else f"{value:.2f}".rstrip("0").rstrip(".")

    return "".join(
        f"{r.time:.3f},{r.node},{r.gpu}," + ",".join(map(text, r[3:])) + "\n" for r in rows
    )


def parse_line(line: str) -> Optional[Row]:
    """A line of a gpu-<node>.csv without its newline; None: the header, or damage."""
    parts = line.split(",")
    when, gpu = (number(parts[0]), number(parts[2])) if len(parts) == 6 else (None, None)
    if when is None or gpu is None:
        return None
    return Row(when, parts[1], int(gpu), *(number(p) for p in parts[3:]))


def read_csv(path: str) -> "list[Row]":  # a line cut short (no newline) is skipped too
    with open(path, errors="replace") as handle:
        return [r for r in map(parse_line, (x[:-1] for x in handle if x.endswith("\n"))) if r]


def analyze(rows: "list[Row]") -> Optional[Verdict]:
    """The input-bound verdict over a window's samples (of any nodes), or None: some GPUs
    idle while the others are busy (SOME_IDLE), or all of them mostly idle (ALL_IDLE).
    MI250X secondary dies: odd GPUs without power (or 0 W) where the even one before has."""
    powered = {(r.node, r.gpu) for r in rows if r.power_w}
    secondary = {(r.node, r.gpu) for r in rows if r.gpu % 2 and (r.node, r.gpu - 1) in powered}
    secondary -= powered
    peak = {}  # type: dict[str, float]
    for r in rows:
        if r.power_w and (r.node, r.gpu) not in secondary:
            peak[r.node] = max(peak.get(r.node, 0.0), r.power_w)
    counts = {}  # type: dict[tuple[str, int], list[int]] # (node, gpu) -> [idle, judged]
    for r in rows:
        if r.busy_pct is not None:
            idle = r.busy_pct < IDLE_BUSY_PCT
        elif (r.node, r.gpu) in secondary or not r.power_w or not peak.get(r.node):
            continue  # it cannot say
        else:
            idle = r.power_w < IDLE_POWER_SHARE * peak[r.node]
        count = counts.setdefault((r.node, r.gpu), [0, 0])
        count[0] += int(idle)
        count[1] += 1
    judged = {gpu: c for gpu, c in sorted(counts.items()) if c[1] >= MIN_SAMPLES}
    if not judged:
        return None
    share = {gpu: c[0] / c[1] for gpu, c in judged.items()}
    named = [gpu for gpu, s in share.items() if s >= GPU_IDLE_SHARE]
    kind = SOME_IDLE
    if not named or statistics.median(1 - s for s in share.values()) < OTHERS_BUSY_SHARE:
        named, kind = list(share), ALL_IDLE
    together = sum(judged[g][0] for g in named) / sum(judged[g][1] for g in named)
    if kind == ALL_IDLE and together < ALL_IDLE_SHARE:
        return None
    span = max(r.time for r in rows) - min(r.time for r in rows)
    return Verdict(kind, [(n, g, share[(n, g)]) for n, g in named], together, span)


def warning(verdict: Verdict) -> str:
    """The warning, one line: what was idle, how much, and what to do."""
    span = verdict.span_s
    window = f"{span:.0f} s" if span < 120 else f"{span / 60:.0f} min"
    if verdict.kind == SOME_IDLE:
        named = "; ".join(f"GPU {g} on {n} idle {s:.0%}" for n, g, s in verdict.gpus)
        what = f"while the other GPUs were busy: {named} of the time"
    else:
        nodes = dict.fromkeys(n for n, _, _ in verdict.gpus)  # in order, once each
        gpus = {n: ",".join(str(g) for m, g, _ in verdict.gpus if m == n) for n in nodes}
        where = "; ".join(f"{n} GPU {gs}" for n, gs in gpus.items())
        what = f"all {len(verdict.gpus)} GPUs ({where}) idle {verdict.idle_share:.0%} of the time"
    return (
        f"input-bound? over the last {window}, {what} (idle: busy < {IDLE_BUSY_PCT:.0f}%)."
        " The GPUs are waiting for data: put the data set on the nodes with --stage, and"
        " give the data loader more workers (e.g. DataLoader(num_workers=N))."
    )


class Watch:
    """Where the samples go, when to stop, and the warning, once."""

    def __init__(self, args: argparse.Namespace, node: str) -> None:
        self.args, self.node, self.parent = args, node, os.getppid()
        self.path = args.out.replace("{node}", node)
        self.recent = []  # type: list[Row]
        self.first: Optional[float] = None
        self.fd: Optional[int] = None
        self.stopped = self.warned = False
        self.wake, wake_w = os.pipe()
        for fd in (self.wake, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w)  # a signal ends a wait at once
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda *_: setattr(self, "stopped", True))

    def done(self) -> bool:
        asked = self.args.stop_file and os.path.exists(self.args.stop_file)
        gone = any(not os.path.exists(f"/proc/{pid}") for pid in self.args.pid)
        return bool(self.stopped or asked or gone or os.getppid() != self.parent)

    def wait(self, seconds: float, fds: "tuple[int, ...]" = ()) -> "list[int]":
        """Until a signal, one of `fds` is readable, or `seconds` (at most 1) passed."""
        ready = select.select([self.wake, *fds], [], [], max(0.0, min(seconds, 1.0)))[0]
        if self.wake in ready:
            with contextlib.suppress(OSError):
                os.read(self.wake, 512)
        return [fd for fd in ready if fd != self.wake]

    def add(self, when: float, readings: "list[Row]") -> None:
        rows = [r._replace(time=when, node=self.node) for r in readings]
        if not rows:
            return
        self.write(csv_lines(rows))
        self.first = when if self.first is None else self.first
        self.recent = [r for r in self.recent if r.time > when - self.args.window] + rows
        if self.warned or when - self.first < self.args.warmup + self.args.window:
            return
        verdict = analyze(self.recent)
        if verdict is not None:
            self.warned = True
            self.warn(verdict)

    def write(self, text: str) -> None:
        try:
            if self.fd is None:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
                text = (HEADER if os.fstat(self.fd).st_size == 0 else "") + text
            if self.fd >= 0:
                os.write(self.fd, text.encode())  # one write per sample
        except OSError as exc:
            say(f"cannot write {self.path}: {exc}; no more samples are written")
            self.fd = -1

    def warn(self, verdict: Verdict) -> None:
        text = warning(verdict)
        if self.args.warn:
            say(text, "hpclaunch: warning: ")
        gpus = [list(g) for g in verdict.gpus]
        record = {"event": INPUT_BOUND, "node": self.node, "kind": verdict.kind, "gpus": gpus}
        if self.args.events:  # one line, one write on O_APPEND: lines of nodes never mix
            with contextlib.suppress(OSError), open(self.args.events, "a") as handle:
                handle.write(json.dumps(dict(record, message=text, time=time.time())) + "\n")


def watch_nvidia(tool: str, watch: Watch) -> int:
    """nvidia-smi's loop: a sample is the lines of one iteration (till a pause or a repeat)."""
    interval = watch.args.interval
    argv = [tool, "--query-gpu=" + NVIDIA_QUERY, "--format=csv,noheader,nounits"]
    argv += ["-lms", str(max(1, round(interval * 1000)))]
    proc = subprocess.Popen(argv, stdout=PIPE, stderr=DEVNULL)
    out = proc.stdout.fileno() if proc.stdout else -1
    os.set_blocking(out, False)
    block = {}  # type: dict[int, Row]
    pending, stray, when, ended = b"", "", time.time(), False
    while not ended and not watch.done():
        if not watch.wait(interval / 2, (out,)):
            watch.add(when, list(block.values()))
            block = {}
            continue
        chunk = os.read(out, 65536)
        ended = not chunk
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            text = line.decode(errors="replace").strip()
            found = parse_nvidia(text)
            stray = stray or ("" if found else text)  # e.g. "No devices were found"
            for reading in found:
                if reading.gpu in block:
                    watch.add(when, list(block.values()))
                    block = {}
                when = when if block else time.time()
                block[reading.gpu] = reading
    watch.add(when, list(block.values()))
    if ended and not watch.done():  # not by the signal that stops the watch too
        say(f"{tool} ended (exit code {proc.wait()}) on {watch.node}" + (stray and ": " + stray))
    proc.kill()  # nvidia-smi only reads: nothing to clean up (a no-op once it ended)
    proc.wait()
    return 0


def watch_one_shot(tool: str, watch: Watch) -> int:
    """rocm-smi, amd-smi: a call per sample (a late one delays the next: never two at once)."""
    argv = [tool, *ONE_SHOT[os.path.basename(tool)]]
    due, reported = time.monotonic(), False
    while not watch.done():
        if time.monotonic() < due:
            watch.wait(due - time.monotonic())
            continue
        due = max(due + watch.args.interval, time.monotonic())
        try:
            out = subprocess.run(argv, stdout=PIPE, stderr=DEVNULL, timeout=60).stdout
            readings = parse_json(out.decode(errors="replace"))
        except (OSError, subprocess.TimeoutExpired):
            readings = []
        if readings:
            watch.add(time.time(), readings)
        elif not reported and not watch.done():  # (a stop signal may have ended the call)
            reported = True
            say(f"{' '.join(argv)} gave no GPU readings on {watch.node}")
    return 0


def main(argv: "list[str]") -> int:
    parser = argparse.ArgumentParser(prog="gpu_watch.py", description="hpclaunch GPU watch")
    parser.add_argument("--out", required=True, help="the CSV; {node}: the node's name")
    parser.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds")
    window = number(os.environ.get(WINDOW_ENV, "")) or WINDOW_S
    warmup = number(os.environ.get(WARMUP_ENV, "")) or WARMUP_S
    parser.add_argument("--window", type=float, default=window, help="seconds judged")
    parser.add_argument("--warmup", type=float, default=warmup, help="seconds not judged")
    parser.add_argument("--warn", action="store_true", help="print the warning on stderr")
    parser.add_argument("--events", help="append the warning to this events.jsonl")
    parser.add_argument("--stop-file", help="stop once this file exists")
    parser.add_argument("--pid", type=int, action="append", default=[], help="stop once gone")
    args = parser.parse_args(argv)
    if not args.interval > 0:
        parser.error("--interval must be positive")
    node = node_name(os.environ)
    # PATH, then ROCm's own folder (LUMI's nodes have rocm-smi there, module or not).
    path = (os.environ.get("PATH") or os.defpath) + os.pathsep + ROCM_BIN
    tool = next(filter(None, (shutil.which(name, path=path) for name in TOOLS)), None)
    if tool is None:
        # Once for the job, not once a node: nodes of a job are alike.
        if os.environ.get("SLURM_NODEID", "0") == "0":
            say(f"no {', '.join(TOOLS)} on PATH on {node}: no GPU samples")
        return 0
    with contextlib.suppress(OSError):
        os.nice(10)  # never take a CPU from the ranks
    watch = Watch(args, node)
    if os.path.basename(tool) == "nvidia-smi":
        return watch_nvidia(tool, watch)
    return watch_one_shot(tool, watch)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
