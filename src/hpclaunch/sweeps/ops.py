"""What one does to a sweep after submitting it: find it, wait for it, retry some of its
points, cancel some or all, change how many run at once. Every command asks Slurm as
track.refresh does (one squeue, at most one sacct) and acts in one call per array.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, TextIO

from .. import discover, index, records, slurmcmd
from ..errors import UserError, show
from ..states import State
from . import arrays, pointstate, record, track

# Waiting: ask again after 1, 2, 4, 8 s, then every 10 s (one squeue, rarely one sacct).
WAIT_INTERVALS_S = (1.0, 2.0, 4.0, 8.0, 10.0)


def find(ref: str, environ: Mapping[str, str]) -> Path:
    """SWEEP = a sweep id, a unique prefix, an array job id, or `last` (the newest sweep)."""
    entries = [e for e in index.live(environ) if e.get("sweep")]
    if not entries:
        raise UserError(
            "SWEEP", f"no sweeps recorded yet ({show(ref)})", "", "Start one with hpclaunch sweep"
        )
    if ref == "last":
        return Path(entries[0]["run_dir"])
    for match in (
        [e for e in entries if e["run_id"] == ref],
        [e for e in entries if _array_ids(e) and ref in _array_ids(e)],
        [e for e in entries if e["run_id"].startswith(ref)],
    ):
        if len(match) == 1:
            return Path(match[0]["run_dir"])
        if len(match) > 1:
            raise UserError(
                "SWEEP",
                f"{show(ref)} matches {len(match)} sweeps",
                "the prefix must be unique",
                f"Type more of it, e.g. {match[0]['run_id']}",
            )
    raise UserError(
        "SWEEP",
        f"no sweep matches {show(ref)}",
        "a sweep id, a unique prefix, an array job id or last",
        "See hpclaunch runs",
    )


def _array_ids(entry: Mapping[str, Any]) -> list[str]:
    try:
        data = record.load(Path(entry["run_dir"]))
    except record.DamagedSweep:
        return []
    return [str(a["job_id"]) for a in data.get("arrays") or []]


def point_folder(ref: str, environ: Mapping[str, str]) -> Path:
    """SWEEP:INDEX -> that point's run folder."""
    sweep_ref, _, index_text = ref.rpartition(":")
    folder = find(sweep_ref, environ)
    data = record.load(folder)
    if not index_text.isdigit() or int(index_text) >= len(data["points"]):
        raise UserError(
            "RUN",
            f"{show(ref)} names no point of sweep {data['sweep_id']}",
            f"points 0-{len(data['points']) - 1}",
            "",
        )
    return record.point_dir(folder, int(index_text))


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


def exit_code(sweep: track.Sweep) -> int:
    """0 when every point completed, else the lowest-index unfinished point's code."""
    for rec in sorted(sweep.points, key=lambda r: int(r.extra.get("point", 0))):
        if rec.state != State.COMPLETED:
            return rec.exit_code if rec.exit_code else 1
    return 0


def wait(sweep_dir: Path, out: TextIO, is_tty: bool, timeout: Optional[float] = None) -> int:
    """Follow until no point is pending or running; then the sweep's exit code."""
    from .progress import Progress

    deadline = None if timeout is None else time.monotonic() + timeout
    shown = Progress(out, is_tty)
    step = 0
    try:
        while True:
            sweep = track.refresh(sweep_dir)
            shown.show(sweep)
            if not sweep.active():
                return exit_code(sweep)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sweep {sweep.sweep_id} still running")
            time.sleep(WAIT_INTERVALS_S[min(step, len(WAIT_INTERVALS_S) - 1)])
            step += 1
    finally:
        shown.end()


def cancel(sweep_dir: Path, points: Optional[Sequence[int]]) -> list[str]:
    """scancel the open points (all, or those): one call. Returns what was cancelled."""
    sweep = track.refresh(sweep_dir)
    chosen = set(points) if points is not None else None
    open_ = [
        r
        for r in sweep.points
        if pointstate.is_open(r) and (chosen is None or int(r.extra.get("point", -1)) in chosen)
    ]
    if sweep.data.get("backend") == "local":
        from ..backends.local import cancel_recorded

        for rec in open_:
            cancel_recorded(rec.launcher_pid, rec.launcher_started, rec.pgids)
        return [rec.run_id for rec in open_]
    if chosen is None:
        targets = sorted({str(r.job_id).partition("_")[0] for r in open_ if r.job_id})
    else:
        targets = [str(r.job_id) for r in open_ if r.job_id]
    if targets:
        slurmcmd.run(["scancel", *targets])
    return targets


def throttle(sweep_dir: Path, parallel: int) -> list[tuple[str, int]]:
    """At most `parallel` points at once from now on, shared between the open arrays."""
    if parallel < 1:
        raise UserError("P", f"{parallel} is below 1", "at least 1", "")
    sweep = track.refresh(sweep_dir)
    open_arrays: dict[str, int] = {}
    for rec in sweep.points:
        if pointstate.is_open(rec) and rec.job_id:
            array_id = str(rec.job_id).partition("_")[0]
            open_arrays[array_id] = open_arrays.get(array_id, 0) + 1
    ids = sorted(open_arrays, key=int)
    shares = arrays.share_throttle(parallel, [open_arrays[i] for i in ids])
    done = []
    for array_id, share in zip(ids, shares):
        value = share or parallel
        slurmcmd.run(["scontrol", "update", f"JobId={array_id}", f"ArrayTaskThrottle={value}"])
        done.append((array_id, value))
    opts = dict(sweep.data.get("sweep") or {})
    opts["max_parallel"] = parallel
    record.update(sweep_dir, sweep=opts)
    return done


def retry(sweep_dir: Path, points: Optional[Sequence[int]], environ: Mapping[str, str]) -> Any:
    """Resubmit those points (None: every point not COMPLETED) as arrays of just them,
    into the same sweep; their earlier attempts stay under attempts/<n>/."""
    sweep = track.refresh(sweep_dir)
    by_index = {int(r.extra.get("point", 0)): r for r in sweep.points}
    wanted = (
        sorted(points)
        if points is not None
        else sorted(i for i, r in by_index.items() if r.state != State.COMPLETED)
    )
    if not wanted:
        raise UserError("sweep retry", "every point completed", "", "Nothing to retry")
    busy = [i for i in wanted if pointstate.is_open(by_index[i])]
    if busy:
        raise UserError(
            "sweep retry",
            f"point {busy[0]} is {by_index[busy[0]].state}",
            "only ended points are retried",
            f"Wait, or hpclaunch sweep cancel {sweep.sweep_id} --points {busy[0]}",
        )
    if sweep.data.get("kind") == "optuna":
        from . import trials

        again = set(wanted)
        trials.fail_stale(sweep_dir, sweep.sweep_id, lambda idx: {i for i in idx if i not in again})
    for i in wanted:
        record.keep_attempt(by_index[i].path, int(by_index[i].extra.get("attempts", 1)))
    if sweep.data.get("backend") == "local":
        return wanted
    return _resubmit(sweep, wanted, by_index, environ)


def _resubmit(
    sweep: track.Sweep,
    wanted: list[int],
    by_index: Mapping[int, records.RunRecord],
    environ: Mapping[str, str],
) -> list[str]:
    from ..backends.slurm import sbatch_env
    from .submit import array_entries, submit_parts

    max_array, _ = arrays.limits_from_config(discover.slurm_config() or {})
    parallel = (sweep.data.get("sweep") or {}).get("max_parallel")
    parts = arrays.split(wanted, max_array, parallel)
    job_ids = submit_parts(sweep.sweep_dir / "job.sh", parts, sbatch_env(environ))
    attempt = 1 + max((int(a.get("attempt", 1)) for a in sweep.data.get("arrays") or []), default=1)
    for part, job_id in zip(parts, job_ids):
        for point in part.points():
            rec = by_index[point]
            job = f"{job_id}_{point - part.offset}"
            records.update(
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
    record.update(sweep.sweep_dir, arrays=[*(sweep.data.get("arrays") or []), *entries])
    return job_ids
