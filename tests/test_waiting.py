"""waiting.py: the one back-off of every wait, counted with a fake clock. The Slurm status
calls of hours of waiting (run --wait, logs --follow, sweep wait) in milliseconds; Slurm
itself answers in the e2e tests (test_e2e_lifecycle, test_e2e_sweep)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import pytest

from hpclaunch.config.profiles import load_profile
from hpclaunch.observe import waiting
from hpclaunch.observe.jobend import JobStatus, wait_and_stream
from hpclaunch.observe.waiting import Backoff
from hpclaunch.records import runrecord
from hpclaunch.slurm import commands


class Clock:
    """A fake clock whose sleep runs the timeline's actions (files a job writes)."""

    def __init__(self, actions: Optional[list[tuple[float, Callable[[], None]]]] = None) -> None:
        self.now = 5000.0
        self.start = self.now
        self.actions = sorted(actions or [], key=lambda a: a[0])

    @property
    def t(self) -> float:
        return self.now - self.start

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds
        while self.actions and self.actions[0][0] <= self.t:
            self.actions.pop(0)[1]()


class Job(Clock):
    """A status source following a timeline of states; it counts its calls."""

    def __init__(
        self,
        timeline: list[tuple[float, str]],
        actions: Optional[list[tuple[float, Callable[[], None]]]] = None,
    ) -> None:
        super().__init__(actions)
        self.timeline = timeline
        self.calls: list[float] = []

    def status(self, job_id: str) -> JobStatus:
        self.calls.append(self.t)
        state = [s for since, s in self.timeline if self.t >= since][-1]
        return JobStatus(state, "Priority" if state == "PENDING" else "None", "0:0")

    def wait(self, logs: Path, backoff: Backoff = waiting.DEFAULT, **kw: Any) -> tuple[int, str]:
        return wait_and_stream(
            self,
            "42",
            logs,
            io.StringIO(),
            io.StringIO(),
            is_tty=False,
            clock=self.clock,
            sleep=self.sleep,
            backoff=backoff,
            **kw,
        )


def most_in_a_minute(calls: list[float], after: float = 0.0) -> int:
    """The most calls in any 60 s window that starts at or after `after`."""
    starts = [t for t in calls if t >= after] or [after]
    return max(sum(1 for t in calls if s <= t < s + 60) for s in starts)


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    folder = tmp_path / "logs"
    folder.mkdir()
    return folder


def exit_file(logs: Path, rank: int) -> Callable[[], None]:
    def write() -> None:
        with open(logs / "ranks.tsv", "a") as fh:
            fh.write(f"{rank}\tn{rank % 2}\t0\t{1000 + rank}\n")
        record = {"rank": rank, "node": "n", "returncode": 0, "time": 1.0}
        (logs / f"rank-{rank}.exit").write_text(json.dumps(record))

    return write


def test_a_job_pending_ten_minutes_asks_at_most_six_times_a_minute(logs: Path) -> None:
    job = Job([(0, "PENDING"), (600, "COMPLETED")])
    assert job.wait(logs) == (0, "COMPLETED")
    assert most_in_a_minute(job.calls, after=60) <= 6, job.calls
    # (before: every 5 s, 12 a minute, however long the job pended)
    assert len([t for t in job.calls if t >= 60]) <= 9 * 6 + 1
    assert job.calls[-1] - 600 <= 10  # the end is still seen within one interval


def test_ranks_exiting_one_by_one_never_bring_calls_nearer_than_5_s(logs: Path) -> None:
    ranks = 64
    exits = [(300 + 0.5 * r, exit_file(logs, r)) for r in range(ranks)]
    job = Job([(0, "RUNNING"), (300 + 0.5 * ranks + 1, "COMPLETED")], exits)
    assert job.wait(logs) == (0, "COMPLETED")
    during = [t for t in job.calls if t >= 290]
    gaps = [b - a for a, b in zip(during, during[1:])]
    assert gaps and min(gaps) >= 5.0, during  # before: 1 s after every exit, 60 a minute
    assert job.calls[-1] - job.timeline[-1][0] <= 5.0  # the end still seen promptly


def test_an_exit_brings_the_next_call_forward(logs: Path) -> None:
    # Running long: every 10 s; a rank's exit 1 s after a call -> the next 5 s after it.
    quiet = Job([(0, "RUNNING"), (400, "COMPLETED")])
    quiet.wait(logs)
    call = next(t for t in quiet.calls if t > 280)
    assert quiet.calls[quiet.calls.index(call) + 1] == pytest.approx(call + 10.0)
    job = Job([(0, "RUNNING"), (400, "COMPLETED")], [(call + 1, exit_file(logs, 0))])
    job.wait(logs)
    assert job.calls[job.calls.index(call) + 1] == pytest.approx(call + 5.0, abs=0.01)


@pytest.mark.parametrize("timeline", [[(0, "PENDING"), (700, "COMPLETED")],
                                      [(0, "RUNNING"), (700, "COMPLETED")]])  # fmt: skip
def test_min_poll_interval_60_asks_at_most_once_a_minute(
    logs: Path, timeline: list[tuple[float, str]]
) -> None:
    exits = [(400 + r, exit_file(logs, r)) for r in range(20)]
    job = Job(timeline, exits)
    job.wait(logs, Backoff(floor_s=60))
    gaps = [b - a for a, b in zip(job.calls, job.calls[1:])]
    assert min(gaps) >= 60 - 1e-9, job.calls
    assert most_in_a_minute(job.calls) <= 1


def test_unknown_jobs_are_asked_again_within_the_loop(logs: Path) -> None:
    # A restarting controller forgets the job for a while: asked again, spaced, no real sleep.
    job = Job([(0, "RUNNING"), (20, "UNKNOWN"), (23, "RUNNING"), (40, "COMPLETED")])
    assert job.wait(logs, unknown_retries=3) == (0, "COMPLETED")
    job = Job([(0, "RUNNING"), (20, "UNKNOWN")])
    assert job.wait(logs, unknown_retries=3) == (120, "UNKNOWN")
    unknown = [t for t in job.calls if t >= 20]
    assert len(unknown) == 4 and unknown[-1] - unknown[0] >= 3 * 2.0
    job = Job([(0, "RUNNING"), (20, "UNKNOWN")])
    job.wait(logs, Backoff(floor_s=60), unknown_retries=3)
    assert min(b - a for a, b in zip(job.calls, job.calls[1:])) >= 60 - 1e-9


def test_the_profile_key_reaches_every_wait(tmp_path: Path) -> None:
    """min_poll_interval from a user's profile file: for_cluster gives the floor."""
    home = tmp_path / "home"
    (home / ".config/hpclaunch/clusters").mkdir(parents=True)
    (home / ".config/hpclaunch/clusters/slurm.toml").write_text("min_poll_interval = 60\n")
    env = {"HOME": str(home)}
    assert load_profile("slurm", None, env).min_poll_interval == 60
    assert waiting.for_cluster("slurm", env, tmp_path).floor_s == 60
    assert waiting.for_cluster("slurm", {"HOME": str(tmp_path)}, tmp_path).floor_s == 0
    assert waiting.for_cluster("no-such-cluster", env, tmp_path).floor_s == 0
    for name in ("local", "slurm", "lumi"):  # the built-in profiles read (default 0)
        assert load_profile(name, None, {"HOME": str(tmp_path)}).min_poll_interval == 0


def test_backoff_with_a_fixed_interval_under_the_floor() -> None:
    poll = waiting.Poll(Backoff(floor_s=30, every_s=5), 0.0)
    poll.asked(0.0, waiting.PENDING)
    assert poll.due == 30
    poll = waiting.Poll(Backoff(every_s=5), 0.0)
    for now in (0.0, 5.0, 10.0):
        poll.asked(now, waiting.RUNNING)
        assert poll.due == now + 5


# --- logs --follow / Run.wait() of a recorded run: handle.follow_to_end -------------------


def test_follow_to_end_uses_the_same_back_off(tmp_path: Path, monkeypatch: Any) -> None:
    from hpclaunch import handle
    from hpclaunch.backends import runstatus
    from hpclaunch.observe.logs import AttemptFollower

    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    runrecord.create(
        run_dir, {"run_id": "r1", "backend": "slurm", "job_id": "9", "state": "PENDING"}
    )
    clock = Clock()
    calls: list[float] = []

    def refresh_one(folder: Path) -> runrecord.RunRecord:
        calls.append(clock.t)
        if clock.t >= 900:
            runrecord.update(folder, state="COMPLETED", exit_code=0)
        return runrecord.load(folder)

    monkeypatch.setattr(runstatus, "refresh_one", refresh_one)
    follower = AttemptFollower(run_dir / "logs", io.StringIO(), io.StringIO())
    got = handle.follow_to_end(run_dir, follower, clock=clock.clock, sleep=clock.sleep)
    assert got.state == "COMPLETED"
    assert most_in_a_minute(calls, after=60) <= 6  # before: every 10 s was its cap, too
    calls.clear()
    clock = Clock()
    runrecord.update(run_dir, state="PENDING")
    handle.follow_to_end(
        run_dir, follower, backoff=Backoff(floor_s=60), clock=clock.clock, sleep=clock.sleep
    )
    assert min(b - a for a, b in zip(calls, calls[1:])) >= 60 - 1e-9


# --- sweep wait ---------------------------------------------------------------------------


def _sweep(tmp_path: Path, points: int, running: int) -> Path:
    """A Slurm sweep's folder: points-running COMPLETED, the last `running` RUNNING."""
    folder = tmp_path / "sw1"
    (folder / "points").mkdir(parents=True)
    data = {
        "sweep_id": "sw1",
        "sweep_dir": str(folder),
        "cluster": "slurm",
        "backend": "slurm",
        "points": [{"index": i, "params": {}} for i in range(points)],
        "arrays": [{"job_id": "500", "offset": 0, "count": points, "attempt": 1}],
        "sacct_mode": "-X",
    }
    (folder / "sweep.json").write_text(json.dumps(data))
    for i in range(points):
        point = folder / "points" / str(i)
        point.mkdir()
        done = i < points - running
        record = {
            "run_id": f"sw1-{i}",
            "run_dir": str(point),
            "backend": "slurm",
            "job_id": f"500_{i}",
            "state": "COMPLETED" if done else "RUNNING",
            "exit_code": 0 if done else None,
            "sweep_id": "sw1",
            "point": i,
        }
        (point / "run.json").write_text(json.dumps(record))
    return folder


def _point_ends(folder: Path, index: int) -> Callable[[], None]:
    def write() -> None:
        event = {"event": "point_end", "job": f"500_{index}", "exit_code": 0, "time": 1.0}
        with open(folder / "points" / str(index) / "events.jsonl", "a") as fh:
            fh.write(json.dumps(event) + "\n")

    return write


def test_sweep_wait_rereads_only_the_points_still_open(tmp_path: Path, monkeypatch: Any) -> None:
    from hpclaunch.sweeps import ops

    folder = _sweep(tmp_path, 1000, 10)
    clock = Clock([(100 + 30 * k, _point_ends(folder, 990 + k)) for k in range(10)])
    squeues: list[float] = []

    def fake_slurm(argv: list[str], *args: Any, **kw: Any) -> str:
        assert argv[0] == "squeue", argv  # the points still open: one squeue a refresh
        squeues.append(clock.t)
        return "".join(f"500|{i}|{600 + i}|RUNNING|None\n" for i in range(990, 1000))

    loads: list[list[int]] = []
    real_load = runrecord.load

    def counting_load(run_dir: Path) -> runrecord.RunRecord:
        if run_dir.parent.name == "points":
            loads[-1].append(int(run_dir.name))
        return real_load(run_dir)

    def refresh_marker(t: float) -> None:
        loads.append([])

    monkeypatch.setattr(commands, "run", fake_slurm)
    monkeypatch.setattr(runrecord, "load", counting_load)
    monkeypatch.setattr(commands, "query", lambda *a, **k: None)
    real_sleep = clock.sleep

    def sleep(seconds: float) -> None:
        real_sleep(seconds)
        refresh_marker(clock.t)

    loads.append([])
    out = io.StringIO()
    code = ops.wait(folder, out, False, backoff=Backoff(), clock=clock.clock, sleep=sleep)
    assert code == 0
    assert "1000/1000 done" in out.getvalue()
    reads = [batch for batch in loads if batch]
    assert len(set(reads[0])) == 1000  # the first refresh reads every point once
    assert len(reads) > 10
    for batch in reads[1:]:
        assert set(batch) <= set(range(990, 1000)), batch  # never a finished one again
        assert len(set(batch)) <= 10
    assert most_in_a_minute(squeues, after=60) <= 6


def test_sweep_wait_interval_below_the_floor_says_so(tmp_path: Path, monkeypatch: Any) -> None:
    from click.testing import CliRunner

    from hpclaunch.cli import common, sweep_cmd
    from hpclaunch.sweeps import ops

    folder = _sweep(tmp_path, 3, 0)
    seen: dict[str, Any] = {}

    def fake_wait(sweep_dir: Path, out: Any, is_tty: bool, **kw: Any) -> int:
        seen.update(kw)
        return 0

    monkeypatch.setattr(common, "find_sweep_dir", lambda ref: folder)
    monkeypatch.setattr(ops, "wait", fake_wait)
    monkeypatch.setattr(waiting, "site_floor", lambda *a, **k: 60.0)
    done = CliRunner().invoke(sweep_cmd.sweep_group, ["wait", "sw1", "--interval", "5"])
    assert done.exit_code == 0, done.output
    assert done.stderr.strip() == (
        "hpclaunch: --interval 5 is below the cluster's min_poll_interval 60: refreshing every 60 s"
    )
    assert seen["backoff"] == Backoff(floor_s=60, every_s=5)
    done = CliRunner().invoke(sweep_cmd.sweep_group, ["wait", "sw1", "--interval", "90"])
    assert done.exit_code == 0 and done.stderr == ""
    assert seen["backoff"].gap(1.0) == 90


# --- run --wait and Run.wait() of a Slurm run: Backend.wait --------------------------------


def test_backend_wait_obeys_the_run_clusters_profile(tmp_path: Path, monkeypatch: Any) -> None:
    """Backend.wait (run --wait, Run.wait()) takes the floor of the run's recorded cluster
    from its profile (a user's file here) and asks again about an unknown job inside the
    loop, under that floor, instead of sleeping in the status call."""
    from collections.abc import Sequence

    from hpclaunch.backends.base import Backend
    from hpclaunch.records.runpaths import RunPaths

    home = tmp_path / "home"
    (home / ".config/hpclaunch/clusters").mkdir(parents=True)
    (home / ".config/hpclaunch/clusters/slurm.toml").write_text("min_poll_interval = 60\n")
    monkeypatch.setattr("hpclaunch.basics.environ.environment", lambda: {"HOME": str(home)})
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    runrecord.create(run_dir, {"run_id": "r1", "cluster": "slurm", "backend": "slurm"})
    job = Job([(0, "UNKNOWN"), (150, "COMPLETED")])

    class Forgetful(Backend):
        unknown_retries = 3

        def start(self, launch: Any) -> str:
            return "42"

        def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
            found = job.status(job_ids[0])
            return {} if found.state == "UNKNOWN" else {job_ids[0]: found}

        def cancel(self, job_id: str) -> None:
            pass

    def fake_clock_wait(*args: Any, **kw: Any) -> tuple[int, str]:
        assert kw["backoff"].floor_s == 60
        return wait_and_stream(*args, **{**kw, "clock": job.clock, "sleep": job.sleep})

    monkeypatch.setattr("hpclaunch.backends.base.wait_and_stream", fake_clock_wait)
    paths = RunPaths("r1", run_dir, run_dir / "checkpoints")
    code, state = Forgetful().wait("42", paths, io.StringIO(), io.StringIO())
    assert (code, state) == (0, "COMPLETED")  # three UNKNOWN answers, then it was known
    assert job.calls == [0, 60, 120, 180]  # a minute apart, never sooner
