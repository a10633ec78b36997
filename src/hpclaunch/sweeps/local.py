"""A sweep on --cluster local: the same points, folders and variables, run here,
--max-parallel points at a time (default 1), each through the local backend as one run.
An Optuna point asks for its trial before it starts and tells the result after, in this
process (the journal is the same file a Slurm sweep uses).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TextIO

from .. import records, render
from ..backends.base import Launch
from ..backends.local import LocalBackend
from ..launching import Request
from ..states import State
from . import record, script
from .folder import point_record
from .plans import SweepPlan
from .points import Point


def run_local(req: Request, sp: SweepPlan, data: dict[str, Any], out: TextIO) -> int:
    """Run every point; the exit code is 0 when all completed, else the lowest-index
    failed point's code."""
    _write_local_records(sp, data)
    parallel = sp.options.max_parallel or 1
    backend = LocalBackend()
    lock = threading.Lock()
    running: set[int] = set()
    codes: dict[int, int] = {}
    pending = list(sp.points)
    futures: dict[Future[int], int] = {}
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        try:
            while pending or futures:
                while pending and len(futures) < parallel:
                    point = pending.pop(0)
                    futures[pool.submit(_run_point, req, sp, point, backend, running, lock)] = (
                        point.index
                    )
                done, _ = wait(futures, return_when=FIRST_COMPLETED)
                for fut in done:
                    index = futures.pop(fut)
                    codes[index] = fut.result()
                    _say(out, sp, index)
        except BaseException:
            for job in list(backend._jobs):
                backend.cancel(job)
            for point in pending:  # never started: their records say so, not PENDING
                records.update(
                    script.point_paths(sp.paths, str(point.index)).run_dir,
                    state=State.CANCELLED.value,
                    exit_code=121,
                    reason="the local sweep was interrupted",
                )
            raise
    failed = sorted(i for i, c in codes.items() if c != 0)
    return codes[failed[0]] if failed else 0


def _say(out: TextIO, sp: SweepPlan, index: int) -> None:
    rec = records.load(record.point_dir(sp.paths.run_dir, index))
    params = record.params_of(rec.path, rec.extra.get("params") or {})
    text = " ".join(f"{k}={v}" for k, v in params.items())
    out.write(f"point {index}: {rec.state} (exit {rec.exit_code}) {text}\n")
    out.flush()


def _run_point(
    req: Request,
    sp: SweepPlan,
    point: Point,
    backend: LocalBackend,
    running: set[int],
    lock: threading.Lock,
) -> int:
    spec, profile = sp.planned.spec, sp.planned.prepared.profile
    paths = script.point_paths(sp.paths, str(point.index))
    if sp.space:
        point = _ask(sp, point, running, lock)
    env = dict(req.environ)
    env.update(script.point_env(sp.paths.run_id, len(sp.points), point))
    env[script.HPCLAUNCH_POINT] = str(point.index)
    plan = render.plan(spec, profile, paths, sp.planned.code.cwd)
    with lock:
        running.add(point.index)
    try:
        job_id = backend.start(Launch(spec, plan, paths, sp.planned.code.cwd, env))
        records.update(
            paths.run_dir,
            job_id=job_id,
            job_ids=[job_id],
            state=State.RUNNING.value,
            started_at=time.time(),
        )
        with open(os.devnull, "w") as sink:  # each point's output is in its own logs/
            code, state = backend.wait(job_id, paths, sink, sink)
    finally:
        with lock:
            running.discard(point.index)
    records.update(paths.run_dir, state=state, exit_code=code, ended_at=time.time())
    if sp.space:
        from . import trials

        trials.tell(
            sp.paths.run_dir,
            sp.paths.run_id,
            point.index,
            code,
            record.result(paths.run_dir),
            str(sp.options.metric),
        )
    return code


def _ask(sp: SweepPlan, point: Point, running: set[int], lock: threading.Lock) -> Point:
    from . import trials

    def alive(indices: Sequence[int]) -> set[int]:
        with lock:
            return {i for i in indices if i in running}

    _, params = trials.ask(
        sp.paths.run_dir, sp.paths.run_id, sp.space, point.index, f"local_{point.index}", alive
    )
    asked = Point(point.index, {k: v for k, v in params.items() if v is not None})
    folder = record.point_dir(sp.paths.run_dir, point.index)
    records.write_json(folder / record.PARAMS_JSON, dict(asked.params))
    records.update(folder, params=dict(asked.params))
    return asked


def _write_local_records(sp: SweepPlan, data: dict[str, Any]) -> None:
    for point in sp.points:
        folder = script.point_paths(sp.paths, str(point.index)).run_dir
        records.create(folder, point_record(sp, point, "local", None))


__all__ = ["run_local"]
