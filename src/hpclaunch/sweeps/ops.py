"""What one does to a sweep after submitting it (refs.py finds it): wait for it, retry
some of its points, cancel some or all, change how many run at once. Every command asks Slurm as
track.refresh does (one squeue, at most one sacct) and acts in one call per array.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, TextIO

from hpclaunch.backends import for_record, sweepstate
from hpclaunch.backends.runstatus import is_open
from hpclaunch.basics.states import State
from hpclaunch.errors import UserError, show
from hpclaunch.observe import waiting
from hpclaunch.records import runrecord, sweeprecord
from hpclaunch.slurm import discover
from hpclaunch.sweeps import arrays
from hpclaunch.sweeps.local import LocalSweep

if TYPE_CHECKING:
    from hpclaunch.backends.base import Backend


def parse_points(text: str, total: int) -> list[int]:
    """`3,7,10-12` -> [3, 7, 10, 11, 12], every one a point of the sweep."""
    found: set[int] = set()
    for item in filter(None, (t.strip() for t in text.split(","))):
        low, sep, high = item.partition("-")
        try:
            first, last = int(low), int(high) if sep else int(low)
        except ValueError:
            raise UserError(
                "--points",
                f"{show(item)} is not a point number or range",
                "",
                "Write e.g. --points 3,7,10-12",
            ) from None
        if first > last or first < 0 or last >= total:
            raise UserError(
                "--points", f"{show(item)} is outside the sweep", f"points 0-{total - 1}", ""
            )
        found.update(range(first, last + 1))
    if not found:
        raise UserError("--points", "no points given", "", "Write e.g. --points 3,7")
    return sorted(found)


def exit_code(sweep: sweepstate.Sweep) -> int:
    """0 when every point completed, else the lowest-index unfinished point's code."""
    for rec in sorted(sweep.points, key=lambda r: int(r.extra.get("point", 0))):
        if rec.state != State.COMPLETED:
            return rec.exit_code if rec.exit_code else 1
    return 0


def wait(
    sweep_dir: Path,
    out: TextIO,
    is_tty: bool,
    timeout: Optional[float] = None,
    *,
    backoff: Optional[waiting.Backoff] = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Follow until no point is pending or running; then the sweep's exit code. The one
    wait loop (waiting.py): `backoff` defaults to the sweep's cluster's; after the first
    refresh only the points still open are read again (track.refresh_open)."""
    from hpclaunch.sweeps.waitview import Progress, tally

    now: list[Optional[sweepstate.Sweep]] = [None]
    if backoff is None:
        backoff = waiting.for_cluster(str(sweeprecord.load(sweep_dir).get("cluster") or ""))
    shown = Progress(out, is_tty)

    def ask(_: float) -> Optional[str]:
        seen = now[0]
        seen = now[0] = (
            sweepstate.refresh(sweep_dir) if seen is None else sweepstate.refresh_open(seen)
        )
        shown.show(seen)
        if not seen.active():
            return None
        return waiting.RUNNING if tally(seen)["running"] else waiting.PENDING

    def still() -> str:
        return f"sweep {now[0].sweep_id if now[0] else sweep_dir.name} still running"

    try:
        waiting.until_ended(
            ask,
            backoff,
            between=lambda _: False,
            tick_s=lambda: 3600.0,  # nothing to do between two refreshes
            clock=clock,
            sleep=sleep,
            deadline=None if timeout is None else clock() + timeout,
            timeout_message=still,
        )
    finally:
        shown.end()
    assert now[0] is not None  # until_ended asks at least once before it returns
    return exit_code(now[0])


def backend_of(sweep: sweepstate.Sweep) -> Backend:
    """The backend that runs the sweep's points (sweep.json records its name)."""
    return for_record(str(sweep.data.get("backend") or ""))


def cancel(sweep_dir: Path, points: Optional[Sequence[int]]) -> list[str]:
    """End the open points (all, or those): one call where the backend allows. Returns
    what was cancelled."""
    sweep = sweepstate.refresh(sweep_dir)
    chosen = set(points) if points is not None else None
    open_ = [
        r
        for r in sweep.points
        if is_open(r) and (chosen is None or int(r.extra.get("point", -1)) in chosen)
    ]
    if chosen is not None and sweep.data.get("pack"):  # a packed point: its slot goes on
        from hpclaunch.sweeps import packplan

        return packplan.cancel_points(sweep_dir, open_)
    return backend_of(sweep).cancel_records(open_, whole=chosen is None)


def throttle(sweep_dir: Path, parallel: int) -> list[tuple[str, int]]:
    """At most `parallel` points at once from now on, shared between the open arrays
    (a sweep that runs here reads it from sweep.json before it starts each point)."""
    if parallel < 1:
        raise UserError("P", f"{parallel} is below 1", "at least 1", "")
    sweep = sweepstate.refresh(sweep_dir)
    opts = dict(sweep.data.get("sweep") or {})
    opts["max_parallel"] = parallel
    sweeprecord.update(sweep_dir, sweep=opts)
    queued = {str(a["job_id"]) for a in sweep.data.get("arrays") or []}
    open_arrays: dict[str, int] = {}
    for rec in sweep.points:
        array_id = str(rec.job_id or "").partition("_")[0]
        if is_open(rec) and array_id in queued:
            open_arrays[array_id] = open_arrays.get(array_id, 0) + 1
    ids = sorted(open_arrays, key=lambda i: (len(i), i))
    shares = arrays.share_throttle(parallel, [open_arrays[i] for i in ids])
    backend = backend_of(sweep)
    done = []
    for array_id, share in zip(ids, shares):
        value = share or parallel
        backend.throttle(array_id, value)
        done.append((array_id, value))
    return done


@dataclass(frozen=True)
class Retried:
    """What `retry` did: the arrays queued, or (a sweep that runs here) what to run."""

    points: list[int]
    job_ids: list[str] = field(default_factory=list)
    here: Optional[LocalSweep] = None


def retry(sweep_dir: Path, points: Optional[Sequence[int]], environ: Mapping[str, str]) -> Retried:
    """Resubmit those points (None: every point not COMPLETED) as arrays of just them,
    into the same sweep; their earlier attempts stay under attempts/<n>/. A sweep whose
    points run here gets them back as pending, for the caller to run (local.run_points)."""
    sweep = sweepstate.refresh(sweep_dir)
    by_index = {int(r.extra.get("point", 0)): r for r in sweep.points}
    wanted = (
        sorted(points)
        if points is not None
        else sorted(i for i, r in by_index.items() if r.state != State.COMPLETED)
    )
    if not wanted:
        raise UserError("sweep retry", "every point completed", "", "Nothing to retry")
    busy = [i for i in wanted if is_open(by_index[i])]
    if busy:
        raise UserError(
            "sweep retry",
            f"point {busy[0]} is {by_index[busy[0]].state}",
            "only ended points are retried",
            f"Wait, or hpclaunch sweep cancel {sweep.sweep_id} --points {busy[0]}",
        )
    if sweep.data.get("kind") == "optuna":
        from hpclaunch.sweeps import trials

        again = set(wanted)
        trials.fail_stale(sweep_dir, sweep.sweep_id, lambda idx: {i for i in idx if i not in again})
    for i in wanted:
        sweeprecord.keep_attempt(by_index[i].path, int(by_index[i].extra.get("attempts", 1)))
    sweeprecord.update(sweep_dir, **{sweeprecord.ENDED_TALLY: None})  # re-opened: `runs` asks again
    backend = backend_of(sweep)
    if backend.foreground:
        return Retried(wanted, here=_again_here(sweep, wanted, by_index, environ))
    return Retried(wanted, _resubmit(sweep, wanted, by_index, environ))


def _again_here(
    sweep: sweepstate.Sweep,
    wanted: list[int],
    by_index: Mapping[int, runrecord.RunRecord],
    environ: Mapping[str, str],
) -> LocalSweep:
    from hpclaunch.sweeps.submit import local_sweep, replanned

    # Planned again for its spec and profile; its folder, id and code are the sweep's own.
    code = Path(str((sweep.data.get("code") or {}).get("cwd") or sweep.data["cwd"]))
    here = replace(
        local_sweep(environ, replanned(sweep.data, environ)),
        sweep_dir=sweep.sweep_dir,
        sweep_id=sweep.sweep_id,
        cwd=code,
    )
    for i in wanted:
        rec = by_index[i]
        runrecord.update(
            rec.path,
            job_id=None,
            state=State.PENDING.value,
            exit_code=None,
            reason="",
            ended_at=None,
            cancel_requested=False,
            attempts=int(rec.extra.get("attempts", 1)) + 1,
            **here.backend.site_facts(),
        )
    return here


def _resubmit(
    sweep: sweepstate.Sweep,
    wanted: list[int],
    by_index: Mapping[int, runrecord.RunRecord],
    environ: Mapping[str, str],
) -> list[str]:
    from hpclaunch.sweeps.submit import array_entries, array_launch

    max_array, _ = arrays.limits_from_config(discover.slurm_config() or {})
    parallel = (sweep.data.get("sweep") or {}).get("max_parallel")
    parts = arrays.split(wanted, max_array, parallel)
    if sweep.data.get("pack"):  # the points back in the queue, one pack (sweeps/packplan.py)
        from hpclaunch.sweeps import packplan

        packplan.queue_again(sweep.sweep_dir, wanted)
        parts = [arrays.ArrayPart(0, (0,), None)]
    launch = array_launch(sweep.sweep_dir / "job.sh", parts, environ)
    job_ids = backend_of(sweep).start_array(launch)
    attempt = 1 + max((int(a.get("attempt", 1)) for a in sweep.data.get("arrays") or []), default=1)
    for part, job_id in zip(parts, job_ids):
        for point in wanted if sweep.data.get("pack") else part.points():
            rec = by_index[point]
            job = job_id if sweep.data.get("pack") else f"{job_id}_{point - part.offset}"
            runrecord.update(
                rec.path,
                job_id=job,
                job_ids=[*rec.job_ids, job],
                state=State.PENDING.value,
                exit_code=None,
                reason="",
                ended_at=None,
                attempts=int(rec.extra.get("attempts", 1)) + 1,
            )
    entries = array_entries(parts, job_ids, attempt)
    sweeprecord.update(sweep.sweep_dir, arrays=[*(sweep.data.get("arrays") or []), *entries])
    return job_ids
