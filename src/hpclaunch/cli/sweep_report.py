"""What the sweep commands print: the submission line (or one JSON object), the dry-run
text, the status table with counts and the best point."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional, TextIO

from hpclaunch.sweeps import submit

# Submitting imports what it uses and no more (a held 1,000-point sweep to its id is
# timed against submitit's whole process): status, wait and retry import theirs inside.
if TYPE_CHECKING:
    from hpclaunch.launching import LaunchRequest
    from hpclaunch.sweeps.plans import SweepOptions, SweepPlan


def submit_and_report(
    req: LaunchRequest, opts: SweepOptions, *, dry_run: bool, wait: bool, as_json: bool
) -> int:
    if opts.pack:  # the points in slots of whole-node allocations (sweeps/packsubmit.py)
        from hpclaunch.sweeps import packsubmit

        sp = packsubmit.plan_packed(req, opts)
    else:
        sp = submit.plan_sweep(req, opts)
    for note in sp.planned.notes:
        print(note, file=sys.stderr)
    if dry_run:
        if as_json:
            print(json.dumps(_dry_json(sp), indent=2))
        else:
            text = packsubmit.describe(sp) if sp.pack else submit.describe(sp, req.environ)
            sys.stdout.write(text)
        return 0
    data = submit.start(req, sp)
    job_ids = [str(a["job_id"]) for a in data.get("arrays") or []]
    if as_json:
        print(
            json.dumps(
                {
                    "sweep_id": sp.paths.run_id,
                    "job_ids": job_ids,
                    "sweep_dir": str(sp.paths.run_dir),
                    "points": len(sp.points),
                }
            )
        )
    else:
        where = f"arrays {','.join(job_ids)}" if job_ids else "local"
        print(f"sweep {sp.paths.run_id}  {where}  {len(sp.points)} points  {sp.paths.run_dir}")
    sys.stdout.flush()
    if sp.local and sp.pack:
        return packsubmit.run_here(sp, req.environ, sys.stderr if as_json else sys.stdout)
    if sp.local:
        return _run_here(req, sp, sys.stderr if as_json else sys.stdout)
    if not wait:
        return 0
    from hpclaunch.sweeps import ops

    try:
        return ops.wait(
            sp.paths.run_dir, sys.stderr if as_json else sys.stdout, sys.stdout.isatty()
        )
    except KeyboardInterrupt:
        print(
            f"hpclaunch: detached; the sweep goes on (hpclaunch sweep wait {sp.paths.run_id})",
            file=sys.stderr,
        )
        return 130


def _run_here(req: LaunchRequest, sp: SweepPlan, out: TextIO) -> int:
    """A local sweep in the foreground: a progress bar as `sweep wait` shows it, then the
    summary (counts, the best point by --metric, the logs of each failed point)."""
    from hpclaunch.cli.common import painted
    from hpclaunch.sweeps.local import run_points, snapshot
    from hpclaunch.sweeps.waitview import Progress, summary

    ls = submit.local_sweep(req.environ, sp)
    progress = Progress(out, out.isatty())
    try:
        code = run_points(ls, range(len(sp.points)), out, progress)
    finally:
        progress.end()
    for line in summary(snapshot(ls), sp.options.metric, sp.options.direction):
        out.write(painted(line, out) + "\n")
    return code


def _dry_json(sp: SweepPlan) -> dict[str, Any]:
    return {
        "sweep_id": sp.paths.run_id,
        "sweep_dir": str(sp.paths.run_dir),
        "script": sp.array_script,
        "point_script": sp.point_template.replace(sp.token, "0"),
        "sbatch": sp.sbatch_argvs(),
        "points": [
            {"index": p.index, "params": dict(p.params), "args": list(p.args)} for p in sp.points
        ],
    }


def print_status(
    ref: str,
    environ: Mapping[str, str],
    metric: Optional[str],
    direction: Optional[str],
    as_json: bool,
) -> int:
    from hpclaunch.backends import sweepstate
    from hpclaunch.backends.runstatus import is_open
    from hpclaunch.cli.common import all_projects_asked
    from hpclaunch.records.refs import sweep_dir

    folder = sweep_dir(ref, environ, all_projects_asked())
    sweep = sweepstate.refresh(folder)
    options = sweep.data.get("sweep") or {}
    if sweep.data.get("kind") == "optuna":
        from hpclaunch.sweeps import trials

        open_ = {int(r.extra.get("point", -1)) for r in sweep.points if is_open(r)}
        trials.fail_stale(folder, sweep.sweep_id, lambda idx: {i for i in idx if i in open_})
    if not metric:  # the --metric (and --direction) given at submission, any sweep's
        metric = options.get("metric")
        direction = direction or options.get("direction")
    rows = [sweepstate.point_row(sweep, r) for r in sweep.points]
    best = sweepstate.best(rows, metric, direction or "minimize") if metric else None
    if as_json:
        print(
            json.dumps(
                {
                    "sweep_id": sweep.sweep_id,
                    "points": rows,
                    "best": best,
                    "counts": sweep.counts(),
                    "metric": metric,
                    "slurm_calls": list(sweep.asked),  # what this refresh asked of Slurm
                }
            )
        )
        return 0
    sys.stdout.write(table(rows))
    counts = ", ".join(f"{n} {s}" for s, n in sorted(sweep.counts().items()))
    print(f"{len(rows)} points: {counts}")
    if metric:
        print(_best_line(best, metric, direction or "minimize"))
    return 0


def _best_line(best: Optional[dict[str, Any]], metric: str, direction: str) -> str:
    if best is None:
        return f"best ({metric}, {direction}): none yet (no point's result has {metric})"
    value = (best.get("result") or {}).get(metric)
    return f"best ({metric}, {direction}): point {best['index']}  {_params(best)}  {metric}={value}"


def _params(row: Mapping[str, Any]) -> str:
    text = " ".join(f"{k}={_short(v)}" for k, v in (row.get("params") or {}).items())
    args = row.get("args") or []
    if args:
        from hpclaunch.basics import shell

        text = (text + " " if text else "") + shell.command(list(args))
    return text or "-"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """POINT PARAMS STATE EXIT RESULT TRIES, aligned; one line a point."""
    head = ("POINT", "PARAMS", "STATE", "EXIT", "RESULT", "TRIES")
    body = [
        (
            str(r["index"]),
            _params(r),
            _state(r),
            "-" if r["exit_code"] is None else str(r["exit_code"]),
            " ".join(f"{k}={_short(v)}" for k, v in (r.get("result") or {}).items()) or "-",
            str(r.get("attempts", 1)),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *body]]
    return "\n".join(lines) + "\n"


def _state(row: Mapping[str, Any]) -> str:
    """The state; a running packed point's with where it runs (backends/packstatus.py)."""
    from hpclaunch.basics.states import State

    reason = str(row.get("reason") or "")
    running = row["state"] == State.RUNNING and reason.startswith("node ")
    return f"{row['state']} ({reason})" if running else str(row["state"])


def retry_and_report(ref: str, failed: bool, points: Optional[str], as_json: bool = False) -> int:
    from hpclaunch.cli.common import all_projects_asked, environ
    from hpclaunch.records import sweeprecord
    from hpclaunch.records.refs import sweep_dir
    from hpclaunch.sweeps import ops

    env = environ()
    folder = sweep_dir(ref, env, all_projects_asked())
    data = sweeprecord.load(folder)
    chosen = ops.parse_points(points, len(data["points"])) if points and not failed else None
    done = ops.retry(folder, chosen, env)
    shown = {"sweep_id": data["sweep_id"], "points": list(done.points), "job_ids": done.job_ids}
    if done.here is not None:  # the points run here, in the foreground, as at submission
        from hpclaunch.sweeps.local import run_points

        if not as_json:
            print(f"sweep {data['sweep_id']}: points {' '.join(map(str, done.points))} again, here")
            sys.stdout.flush()
        code = run_points(done.here, done.points, sys.stderr if as_json else sys.stdout)
        if as_json:
            print(json.dumps({**shown, "exit_code": code}))
        return code
    if as_json:
        print(json.dumps(shown))
        return 0
    print(f"sweep {data['sweep_id']}: resubmitted as arrays {','.join(done.job_ids)}")
    return 0
