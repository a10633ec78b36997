"""`hpclaunch top` and the samples under it (gpumetrics), on run folders written here the
way a job leaves them: run.json, events.jsonl, metrics/gpu-<node>.csv written with the
GPU watch's own writer. No Slurm: finished runs are never asked about, running ones are
local runs (no squeue), and the live loop runs on a fake clock and scheduler."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any, Optional

import pytest
from click.testing import CliRunner, Result
from rich.console import Console

from hpclaunch.cli.main import cli
from hpclaunch.errors import Interrupted, UserError
from hpclaunch.node import gpu_watch
from hpclaunch.node.gpu_watch import Row
from hpclaunch.observe import gpu_metrics, gpu_top
from hpclaunch.records import index, runrecord

T0 = 1_800_000_000.0  # the first sample
RUN_ID = "20270115-080000-000-abcd"
N = 60  # samples per GPU, one every 2 s
NO_TOOL_LINE = "no nvidia-smi, rocm-smi, amd-smi on PATH on nid001: no GPU samples"
MESSAGE = "input-bound? over the last 2 min, while the other GPUs were busy: ..."


def _env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path), "NO_COLOR": "1"}


def make_run(tmp_path: Path, state: str = "COMPLETED", **extra: Any) -> Path:
    """A run folder and its index entry; running runs are local (never asked: no
    launcher pid), finished ones Slurm's (ended: never asked either)."""
    run_dir = tmp_path / "runs" / "default" / RUN_ID
    (run_dir / "logs").mkdir(parents=True)
    backend = "slurm" if state == "COMPLETED" else "local"
    record = {"run_id": RUN_ID, "run_dir": str(run_dir), "backend": backend,
              "cluster": backend, "job_id": "4242", "job_ids": ["4242"], "state": state,
              "submitted_at": T0 - 60, "nodes": 2, "tasks_per_node": 2, **extra}  # fmt: skip
    (run_dir / "run.json").write_text(json.dumps(record))
    index.add({"run_id": RUN_ID, "run_dir": str(run_dir), "job_id": "4242"}, _env(tmp_path))
    return run_dir


def add_events(run_dir: Path, *events: dict[str, Any]) -> None:
    with open(run_dir / "events.jsonl", "a") as handle:
        handle.writelines(json.dumps(e) + "\n" for e in events)


def ranks(run_dir: Path, end: Optional[float] = T0 + 125) -> None:
    """Two ranks a node started 5 s before the first sample (ended at `end`)."""
    for rank in range(4):
        node = "nid001" if rank < 2 else "nid002"
        add_events(run_dir, {"event": "rank_start", "rank": rank, "node": node, "time": T0 - 5})
        if end is not None:
            add_events(run_dir, {"event": "rank_end", "rank": rank, "node": node,
                                 "returncode": 0, "time": end})  # fmt: skip


def samples(node: str, start: int = 0, stop: int = N) -> list[Row]:
    """nid001: GPU 0 busy 80/100 in turn, memory rising; GPU 1 idle for the first half,
    power rising. nid002: GPU 0 without busy readings (MIG); GPU 1 without power."""
    rows = []
    for i in range(start, stop):
        t = T0 + 2 * i
        if node == "nid001":
            rows.append(Row(t, node, 0, 80.0 if i % 2 == 0 else 100.0, 2048.0 + 10 * i, 300.0))
            rows.append(Row(t, node, 1, 0.0 if i < N // 2 else 100.0, 4096.0, 100.0 + i))
        else:
            rows.append(Row(t, node, 0, None, 1024.0, 250.25))
            rows.append(Row(t, node, 1, 40.0, 512.0, None))
    return rows


def write_csv(run_dir: Path, node: str, rows: list[Row], header: bool = True) -> Path:
    path = run_dir / "metrics" / f"gpu-{node}.csv"
    path.parent.mkdir(exist_ok=True)
    with open(path, "a") as handle:
        handle.write((gpu_watch.HEADER if header else "") + gpu_watch.csv_lines(rows))
    return path


def two_by_two(tmp_path: Path, state: str = "COMPLETED") -> Path:
    """A finished 2-node x 2-GPU run, with nid002's input-bound warning."""
    run_dir = make_run(tmp_path, state)
    ranks(run_dir, T0 + 125 if state == "COMPLETED" else None)
    for node in ("nid001", "nid002"):
        write_csv(run_dir, node, samples(node))
    add_events(run_dir, {"event": "input_bound", "node": "nid002", "kind": "some_idle",
                         "gpus": [["nid002", 1, 0.75]], "message": MESSAGE,
                         "time": T0 + 100})  # fmt: skip
    return run_dir


def top(tmp_path: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["top", *args], env=_env(tmp_path), standalone_mode=False)


FINISHED = [
    f"run {RUN_ID} (job 4242): COMPLETED after 2m10s; 2 nodes, 4 GPUs",
    "samples over 1m58s; busy % and power: mean, memory: peak",
    "NODE    GPU  BUSY%  MEM GiB  POWER W  SAMPLES  BUSY% OVER THE RUN",
    "nid001    0     90      2.6      300       60  ▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇▇",
    "nid001    1     50      4.0      130       60  ▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁███████████████",
    "nid002    0      -      1.0      250       60",
    "nid002    1     40      0.5        -       60  ▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄  <- idle 75%",
    f"warning (nid002, after 1m45s): {MESSAGE}",
]


def test_a_finished_run_is_summarised_per_gpu(tmp_path: Path) -> None:
    two_by_two(tmp_path)
    shown = top(tmp_path, "last")
    assert shown.return_value == 0 and shown.stderr == "", shown.output
    assert shown.stdout.splitlines() == FINISHED


def test_json_holds_the_latest_and_summary_figures(tmp_path: Path) -> None:
    two_by_two(tmp_path)
    shown = top(tmp_path, RUN_ID, "--json")
    data = json.loads(shown.stdout)
    assert shown.return_value == 0
    assert (data["run_id"], data["state"], data["elapsed_s"]) == (RUN_ID, "COMPLETED", 130.0)
    assert data["no_samples"] is None and data["finished"] is True
    by_gpu = {(g["node"], g["gpu"]): g for g in data["gpus"]}
    assert list(by_gpu) == [("nid001", 0), ("nid001", 1), ("nid002", 0), ("nid002", 1)]
    one = by_gpu[("nid001", 1)]
    assert one["latest"] == {"time": T0 + 118, "busy_pct": 100.0, "mem_mib": 4096.0,
                             "power_w": 159.0}  # fmt: skip
    assert (one["samples"], one["mean_busy_pct"], one["mean_power_w"]) == (60, 50.0, 129.5)
    assert by_gpu[("nid001", 0)]["peak_mem_mib"] == 2048.0 + 590
    assert by_gpu[("nid002", 0)]["mean_busy_pct"] is None
    assert by_gpu[("nid002", 1)]["input_bound_idle_share"] == 0.75
    assert data["warnings"] == [{"node": "nid002", "kind": "some_idle", "message": MESSAGE,
                                 "gpus": [["nid002", 1, 0.75]], "time": T0 + 100}]  # fmt: skip


def test_a_running_run_shows_its_latest_samples_and_the_last_span(tmp_path: Path) -> None:
    run_dir = two_by_two(tmp_path, state="RUNNING")
    record = runrecord.load(run_dir)
    reader = gpu_metrics.Reader(run_dir)
    reader.update()
    warned = gpu_metrics.input_bound(run_dir)
    now = T0 + 118 + 4
    view = gpu_top.build(record, reader.series(), warned, span_s=60, now=now)
    assert gpu_top.lines(view)[:5] == [
        f"run {RUN_ID} (job 4242): RUNNING for 2m07s; 2 nodes, 4 GPUs",
        "latest sample 4s ago",
        "NODE    GPU  BUSY%  MEM GiB  POWER W  BUSY% LAST 1 MIN",
        "nid001    0    100      2.6      300  " + "█▇" * 15,
        "nid001    1    100      4.0      159  ▁█████████████████████████████",
    ]
    # The last minute, 2 s a character: at 58 s GPU 1 on nid001 was still idle, GPU 0
    # busy 100% (the last character: 80% and 100%, the samples at 116 and 118 s).
    assert view.gpus[1].spark == "▁" + "█" * 29
    later = gpu_top.build(record, reader.series(), warned, span_s=60, now=now + 40)
    assert "(no new samples: is the GPU watch still running?)" in gpu_top.lines(later)[1]
    # The command: one view when stdout is no terminal, exit 0.
    shown = top(tmp_path, "last", "--span", "1")
    assert shown.return_value == 0 and shown.stdout.splitlines()[2:5] == gpu_top.lines(view)[2:5]


def test_sparkline_means_levels_and_gaps() -> None:
    times = [0.0, 1.0, 2.0, 3.0, 6.0, 7.0]
    values = [0.0, 100.0, 50.0, math.nan, 100.0, 100.0]
    # 4 cells of 2 s: (0, 100) -> 50; (50, NaN) -> 50; nothing; (100, 100) -> 100.
    assert gpu_top.sparkline(times, values, 0.0, 8.0, width=4) == "▅▅ █"
    assert gpu_top.sparkline(times, values, 6.5, 8.0, width=2) == "█ "  # 7.0 only
    assert gpu_top.sparkline([], [], 0.0, 1.0, width=3) == "   "


@pytest.mark.parametrize(
    ("setup", "why"),
    [
        ("spec", "it asked for no GPUs (--gpus-per-node 0), so no GPU watch ran"),
        ("no_watch", "it ran with --no-watch"),
        ("local", "it had no GPU watch (local runs and steps of an allocation have none)"),
        ("no_tool", f"no GPU tool on its nodes (logs/batch.out: {NO_TOOL_LINE})"),
        ("nothing", "none were written (the GPU watch did not run: see logs/batch.out)"),
    ],
)
def test_a_run_without_samples_says_why_in_one_line(tmp_path: Path, setup: str, why: str) -> None:
    run_dir = make_run(tmp_path, options={"no_watch": True} if setup == "no_watch" else {})
    spec = {"gpus_per_node": 8, "watch_interval_s": 2.0}  # as spec.json holds them
    if setup == "spec":
        spec["gpus_per_node"] = 0
    if setup == "local":
        spec["watch_interval_s"] = 0.0
    (run_dir / "spec.json").write_text(json.dumps(spec))
    if setup == "no_tool":
        said = gpu_watch.PREFIX + NO_TOOL_LINE  # as the watch prints it into the batch log
        (run_dir / "logs" / "batch.out").write_text(f"starting\n{said}\n")
    (run_dir / "metrics").mkdir()  # an empty folder is no sample either
    shown = top(tmp_path, "last")
    assert shown.return_value == 1 and shown.stdout == ""
    assert shown.stderr == f"hpclaunch: top: run {RUN_ID} has no GPU samples: {why}\n"
    as_json = json.loads(top(tmp_path, "last", "--json").stdout)
    assert as_json["no_samples"] == why and as_json["gpus"] == []


def test_a_bad_span_is_one_user_error(tmp_path: Path) -> None:
    two_by_two(tmp_path)
    shown = top(tmp_path, "last", "--span", "0")
    assert isinstance(shown.exception, UserError)
    assert str(shown.exception).startswith("--span: '0' is not a stretch of time")


def test_a_line_cut_short_or_damaged_is_left_out(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    path = write_csv(run_dir, "nid001", samples("nid001", 0, 3))
    with open(path, "a") as handle:
        handle.write("not,a,sample\n\xff,nid001,0,1,2,3\n")
        last = gpu_watch.csv_lines(samples("nid001", 3, 4))  # GPU 0's line, GPU 1's
        handle.write(last[:-2])  # GPU 1's line cut short: "...,10" of 103 W, no newline
    reader = gpu_metrics.Reader(run_dir)
    assert reader.update() == 7
    got = [(s.node, s.gpu, list(s.times)) for s in reader.series()]
    three = [T0, T0 + 2, T0 + 4]
    assert got == [("nid001", 0, [*three, T0 + 6]), ("nid001", 1, three)]
    # The same samples as the watch's own reader takes (it too skips the cut line).
    assert sorted(gpu_watch.read_csv(str(path))) == sorted(_rows(reader.series()))
    recorded = gpu_watch.csv_lines(samples("nid001", 0, 3)) + last.splitlines(True)[0]
    assert b"".join(reader.lines()) == recorded.encode()


def test_every_line_reads_as_the_watch_reads_it(tmp_path: Path) -> None:
    """The fast path for the watch's own lines and the general one for the rest give
    what gpu_watch.read_csv gives."""
    lines = [gpu_watch.HEADER.strip(), "1.5,n1,0,35,100.25,", "-2,n1,3.0,,,7", "1,n1,0,35 %,1,2",
             "1,n1,0, 35,1e5,2\r", "1,n,1,nan,1,2", "x,n1,0,1,2,3", "1,n1,,1,2,3", "1,n1,0,1,2",
             "1,n1,0,1,2,3,4", "1,n\xff,0,1,2,3", "7.25,n1,1,-0.5,0.0,99.99"]  # fmt: skip
    path = tmp_path / "gpu-n1.csv"
    path.write_text("".join(line + "\n" for line in lines))
    parsed = [gpu_metrics.parse_line(raw) for raw in path.read_bytes().split(b"\n")[:-1]]
    assert [p for p in parsed if p is not None] == gpu_watch.read_csv(str(path))
    assert sum(p is not None for p in parsed) == 7  # "nan": a line without a busy %


def _rows(found: list[gpu_metrics.Series]) -> list[Row]:
    def reading(value: float) -> Optional[float]:
        return None if math.isnan(value) else value

    return [
        Row(s.times[i], s.node, s.gpu, reading(s.busy[i]), reading(s.mem[i]), reading(s.power[i]))
        for s in found
        for i in range(s.samples)
    ]


def test_the_reader_reads_only_what_was_appended(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    path = write_csv(run_dir, "nid001", samples("nid001", 0, 10))
    reader = gpu_metrics.Reader(run_dir)
    assert reader.update() == 20 and reader.offsets[path] == path.stat().st_size
    assert reader.update() == 0  # nothing new: nothing read again
    more = gpu_watch.csv_lines(samples("nid001", 10, 12))
    with open(path, "a") as handle:
        handle.write(more[:-5])  # the watch is still writing the last line
    unfinished = len(more.splitlines(True)[-1]) - 5
    assert reader.update() == 3 and reader.offsets[path] == path.stat().st_size - unfinished
    with open(path, "a") as handle:
        handle.write(more[-5:])
    write_csv(run_dir, "nid002", samples("nid002", 0, 1))  # a node's first sample
    assert reader.update() == 1 + 2
    series = reader.series()
    assert [(s.node, s.gpu, s.samples) for s in series] == [
        ("nid001", 0, 12), ("nid001", 1, 12), ("nid002", 0, 1), ("nid002", 1, 1)
    ]  # fmt: skip
    assert list(series[0].times) == [T0 + 2 * i for i in range(12)]  # no sample twice
    assert series[1].mean_power_w == sum(100.0 + i for i in range(12)) / 12
    path.write_text(gpu_watch.HEADER + gpu_watch.csv_lines(samples("nid001", 0, 1)))
    assert reader.update() == 2 + 2  # replaced, not appended to: everything again
    assert [s.samples for s in reader.series()] == [1, 1, 1, 1]


def test_state_poll_backs_off_while_nothing_changes() -> None:
    poll = gpu_top.StatePoll(0.0)
    waits = []
    for changed in (False, False, False, False, True, False):
        waits.append(poll.due)
        poll.asked(poll.due, changed)
    assert waits == [10.0, 30.0, 70.0, 130.0, 190.0, 200.0]
    poll.soon(205.0)
    assert poll.due == 215.0


def test_state_poll_obeys_min_poll_interval() -> None:
    poll = gpu_top.StatePoll(0.0, floor_s=60)
    asked = [0.0]
    for changed in (True, False, True, True):
        asked.append(poll.due)
        poll.asked(poll.due, changed)
    poll.soon(asked[-1] + 1)
    asked.append(poll.due)
    assert min(b - a for a, b in zip(asked, asked[1:])) >= 60, asked


class FakeJob:
    """The clock, sleep and scheduler of the live loop; a watch appends a sample a
    sleep; the run ends at `ends` (None: never)."""

    def __init__(self, run_dir: Path, ends: Optional[float], sampling: bool = True) -> None:
        self.run_dir, self.ends, self.sampling = run_dir, ends, sampling
        self.now, self.i = T0 + 120, N
        self.asked: list[float] = []  # seconds since the loop began

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.sampling:
            write_csv(self.run_dir, "nid001", samples("nid001", self.i, self.i + 1), False)
            self.i += 1
        if self.now > T0 + 1000:
            raise KeyboardInterrupt

    def refresh(self, run_dir: Path) -> runrecord.RunRecord:
        self.asked.append(self.now - (T0 + 120))
        if self.ends is not None and self.now >= self.ends:
            runrecord.update(run_dir, state="COMPLETED")
        return runrecord.load(run_dir)


def _live(tmp_path: Path, job: FakeJob) -> tuple[Optional[gpu_top.View], str]:
    out = io.StringIO()
    how = gpu_top.Live(Console(file=out, width=100), job.refresh, job.clock, job.sleep)
    shown = gpu_top.live(job.run_dir, runrecord.load(job.run_dir), 300, how)
    return shown, out.getvalue()


def test_live_refreshes_and_asks_the_scheduler_rarely(tmp_path: Path) -> None:
    run_dir = two_by_two(tmp_path, state="RUNNING")
    job = FakeJob(run_dir, ends=T0 + 120 + 250)
    shown, out = _live(tmp_path, job)
    # Every 2 s the samples; the scheduler after 10 s, then 20, 40, 60, 60, 60 s later.
    assert job.asked == [10.0, 30.0, 70.0, 130.0, 190.0, 250.0]
    assert shown is not None and shown.finished and shown.record.state == "COMPLETED"
    assert [g.series.samples for g in shown.gpus] == [60 + 125, 60 + 125, 60, 60]
    assert out.splitlines() == gpu_top.lines(shown)  # the final view stays


def test_live_asks_soon_once_the_samples_stop_and_leaves_on_ctrl_c(tmp_path: Path) -> None:
    run_dir = two_by_two(tmp_path, state="RUNNING")
    job = FakeJob(run_dir, ends=None, sampling=False)
    shown, out = _live(tmp_path, job)
    assert shown is None  # Ctrl-C: the last view stays on the screen
    assert job.asked[:3] == [10.0, 30.0, 42.0]  # stopped at 0: asked 10 s after 32 s
    assert all(b - a == 60.0 for a, b in zip(job.asked[5:], job.asked[6:]))
    assert "no new samples" in out


def test_sigterm_in_the_live_view_is_no_quiet_exit(tmp_path: Path) -> None:
    run_dir = two_by_two(tmp_path, state="RUNNING")
    job = FakeJob(run_dir, ends=None)

    def terminated(seconds: float) -> None:
        raise Interrupted(15)

    job.sleep = terminated  # type: ignore[method-assign]
    with pytest.raises(Interrupted):
        _live(tmp_path, job)


def test_a_run_not_submitted_yet_is_not_finished(tmp_path: Path) -> None:
    """CREATED (written, the backend has not answered) is open, as for every other
    reader of records (states.is_open); `top` took it for a finished run."""
    make_run(tmp_path, "CREATED")
    shown = top(tmp_path, RUN_ID, "--json")
    data = json.loads(shown.stdout)
    assert (data["state"], data["finished"]) == ("CREATED", False)
