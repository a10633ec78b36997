"""A sweep whose backend runs in the foreground (--cluster local): the same points,
folders and variables, each started and waited for through the backend as one run, in
the foreground of `hpclaunch sweep` (or `sweep retry`).

The runner learns of `sweep cancel` and `sweep throttle` from the records, which another
process changes: before it starts a point it claims the point's run.json under its lock
(a point cancelled meanwhile is not started) and reads --max-parallel from sweep.json
again. Its pid and start time are in every point's record, so a cancel reaches a running
point's task groups (backends/localsettle.py) and a refresh after the runner died says
so. An Optuna point asks for its trial before it starts and tells the result after, in
this process (the journal is the same file a Slurm sweep uses).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TextIO

from hpclaunch.backends.base import Backend, Launch
from hpclaunch.backends.localreaper import process_start
from hpclaunch.backends.localsettle import CANCEL_REQUESTED
from hpclaunch.backends.localsignals import KILL_GRACE_S, waiting_line
from hpclaunch.backends.sweepstate import Sweep
from hpclaunch.basics import states
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.records import runrecord, sweeprecord
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import render
from hpclaunch.sweeps import script
from hpclaunch.sweeps.points import Point
from hpclaunch.sweeps.waitview import Progress

_POLL_S = 0.5  # how often the runner looks again for a throttle while points run


@dataclass(frozen=True)
class LocalSweep:
    """What the runner needs of a sweep: the spec and profile planned once, where the
    points' tasks start, the points, and the requester's environment."""

    backend: Backend
    spec: JobSpec
    profile: Any
    cwd: Path  # the job's cwd: the code snapshot
    sweep_dir: Path
    sweep_id: str
    points: Sequence[Point]  # every point of the sweep, by index
    environ: Mapping[str, str]
    space: tuple[Any, ...] = ()
    metric: Optional[str] = None

    def point_dir(self, index: int) -> Path:
        return sweeprecord.point_dir(self.sweep_dir, index)


def run_points(
    ls: LocalSweep, indices: Sequence[int], out: TextIO, progress: Optional[Progress] = None
) -> int:
    """Run those points, at most sweep.json's --max-parallel at a time (read again before
    each start); 0 when all completed, else the lowest-index failed point's code. With
    `progress`, the sweep's bar (as `sweep wait` shows it) follows the points' records."""
    say: Callable[[str], None] = progress.say if progress is not None else _writer(out)
    lock = threading.Lock()
    running: set[int] = set()
    codes: dict[int, int] = {}
    pending = list(indices)
    futures: dict[Future[Optional[int]], int] = {}
    with ThreadPoolExecutor(max_workers=max(1, len(pending))) as pool:
        try:
            while pending or futures:
                while pending and len(futures) < _parallel(ls):
                    index = pending.pop(0)
                    job = pool.submit(_run_point, ls, ls.points[index], running, lock)
                    futures[job] = index
                done, _ = wait(futures, timeout=_POLL_S, return_when=FIRST_COMPLETED)
                for fut in done:
                    index = futures.pop(fut)
                    code = fut.result()
                    if code is not None:
                        codes[index] = code
                        _say(say, ls, index)
                if progress is not None:
                    progress.show(snapshot(ls))
        except BaseException as exc:
            _interrupted(ls, pending, exc)
            if isinstance(exc, KeyboardInterrupt):
                signum = getattr(exc, "signum", signal.SIGINT)
                say(waiting_line(signum, KILL_GRACE_S).rstrip("\n"))
                _let_them_end(ls, list(futures), signum)
            raise
    for index in indices:  # cancelled before they started: their records say so
        if index not in codes:
            rec = runrecord.load(ls.point_dir(index))
            codes[index] = rec.exit_code if rec.exit_code is not None else 1
            _say(say, ls, index)
    if progress is not None:
        progress.show(snapshot(ls))
    failed = sorted(i for i, c in codes.items() if c != 0)
    return codes[failed[0]] if failed else 0


def _parallel(ls: LocalSweep) -> int:
    try:
        given = (sweeprecord.load(ls.sweep_dir).get("sweep") or {}).get("max_parallel")
    except sweeprecord.DamagedSweep:
        given = None
    return int(given) if isinstance(given, int) and given > 0 else 1


def _interrupted(ls: LocalSweep, pending: Sequence[int], exc: BaseException) -> None:
    """Ctrl-C (or SIGTERM): the running points end as a run here would (the user's
    interrupt, recorded so), those never started say so; any other error cancels them."""
    for job in ls.backend.running_jobs():
        if isinstance(exc, KeyboardInterrupt):
            ls.backend.interrupt(job, getattr(exc, "signum", signal.SIGINT))
        else:
            ls.backend.cancel(job)
    signum = getattr(exc, "signum", signal.SIGINT)
    code = 128 + signum if isinstance(exc, KeyboardInterrupt) else None
    for index in pending:
        _claim(ls.point_dir(index), "the local sweep was interrupted", code)


def snapshot(ls: LocalSweep) -> Sweep:
    """The sweep as its points' records say now (this process runs them: no refresh)."""
    data = sweeprecord.load(ls.sweep_dir)
    return Sweep(data, [runrecord.load(ls.point_dir(i)) for i in range(len(ls.points))])


def _writer(out: TextIO) -> Callable[[str], None]:
    def write(text: str) -> None:
        out.write(text + "\n")
        out.flush()

    return write


def _let_them_end(ls: LocalSweep, running: list[Future[Optional[int]]], signum: int) -> None:
    """The interrupted points end in their threads (grace period, then their records);
    each further Ctrl-C is passed on: the ranks are ended at once. Waited for on the
    futures, never by Thread.join, which a KeyboardInterrupt leaves taking a live thread
    for ended (the runner then exited before the points' ends were written)."""
    while True:
        try:
            wait(running)
            return
        except KeyboardInterrupt:
            for job in ls.backend.running_jobs():
                ls.backend.interrupt(job, signum)


def _say(say: Callable[[str], None], ls: LocalSweep, index: int) -> None:
    rec = runrecord.load(ls.point_dir(index))
    params = sweeprecord.params_of(rec.path, rec.extra.get("params") or {})
    text = " ".join(f"{k}={v}" for k, v in params.items())
    say(f"point {index}: {rec.state} (exit {rec.exit_code}) {text}")


def _claim(folder: Path, cancelled_because: str = "", code: Optional[int] = None) -> bool:
    """Take a pending point (RUNNING, under its record's lock): False when a cancel came
    first. With `cancelled_because`: record it as never started instead (with `code`,
    else a cancel's)."""
    cancelled = states.State.CANCELLED

    def decide(data: dict[str, Any]) -> Optional[dict[str, Any]]:
        if data.get("state") not in (states.State.PENDING, states.State.CREATED):
            return None
        if cancelled_because:
            ended = code if code is not None else states.exit_code_for(cancelled)
            return {"state": cancelled.value, "exit_code": ended, "reason": cancelled_because}
        return {"state": states.State.RUNNING.value, "started_at": time.time(), **_runner()}

    return runrecord.update_with(folder, decide) is not None and not cancelled_because


def _runner() -> dict[str, Any]:
    me = os.getpid()
    return {"launcher_pid": me, "launcher_started": process_start(me)}


def _run_point(
    ls: LocalSweep, point: Point, running: set[int], lock: threading.Lock
) -> Optional[int]:
    """One point through the backend; None when it was cancelled before it started."""
    paths = _point_paths(ls, point.index)
    if not _claim(paths.run_dir):
        return None
    # Running from before its ask until after its tell: another point's ask fails the
    # trials of points not running (trials._fail_gone); this one's trial is RUNNING from
    # its ask until its tell (a point left before telling had its trial failed under load).
    with lock:
        running.add(point.index)
    try:
        return _start_and_tell(ls, point, paths, running, lock)
    finally:
        with lock:
            running.discard(point.index)


def _start_and_tell(
    ls: LocalSweep, point: Point, paths: RunPaths, running: set[int], lock: threading.Lock
) -> int:
    if ls.space:
        point = _ask(ls, point, running, lock)
    env = dict(ls.environ)
    env.update(script.point_env(ls.sweep_id, len(ls.points), point))
    env[script.HPCLAUNCH_POINT] = str(point.index)
    plan = render.plan_batch(ls.spec, ls.profile, paths, ls.cwd)
    job_id = ls.backend.start(Launch(ls.spec, plan, paths, ls.cwd, env))
    now = runrecord.update(
        paths.run_dir, job_id=job_id, job_ids=[job_id], **ls.backend.record_extra(job_id)
    )
    if now.get(CANCEL_REQUESTED):  # a cancel came before the task groups were known
        ls.backend.cancel(job_id)
    with open(os.devnull, "w") as sink:  # each point's output is in its own logs/
        code, state = ls.backend.wait(job_id, paths, sink, sink)
    if runrecord.read_raw(paths.run_dir).get(CANCEL_REQUESTED):
        cancelled = states.State.CANCELLED
        code, state = states.exit_code_for(cancelled) or 1, cancelled.value
    reason = ls.backend.end_reason(job_id)  # a Ctrl-C: the user's
    more = {"reason": reason} if reason else {}
    ended = time.time()
    try:  # told before the record ends: `sweep status` fails an ended point's RUNNING trial
        if ls.space:
            from hpclaunch.sweeps import trials

            result = sweeprecord.result(paths.run_dir)
            trials.tell(ls.sweep_dir, ls.sweep_id, point.index, code, result, str(ls.metric))
    finally:
        runrecord.update(paths.run_dir, state=state, exit_code=code, ended_at=ended, **more)
    return code


def _point_paths(ls: LocalSweep, index: int) -> RunPaths:
    rec = runrecord.load(ls.point_dir(index))
    return RunPaths(rec.run_id, rec.path, Path(rec.checkpoint_dir), shipped_dir=ls.sweep_dir)


def _ask(ls: LocalSweep, point: Point, running: set[int], lock: threading.Lock) -> Point:
    from hpclaunch.sweeps import trials

    def alive(indices: Sequence[int]) -> set[int]:
        with lock:
            return {i for i in indices if i in running}

    _, params = trials.ask(
        ls.sweep_dir, ls.sweep_id, ls.space, point.index, f"local_{point.index}", alive
    )
    asked = Point(point.index, {k: v for k, v in params.items() if v is not None})
    folder = ls.point_dir(point.index)
    runrecord.write_json(folder / sweeprecord.PARAMS_JSON, dict(asked.params))
    runrecord.update(folder, params=dict(asked.params))
    return asked


__all__ = ["LocalSweep", "run_points"]
