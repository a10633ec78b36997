"""`hpclaunch cancel` (end a run) and `hpclaunch rerun` (the same run again)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import click

from hpclaunch.cli.common import (
    RUN_ARG_HELP,
    all_projects_flag,
    all_projects_option,
    environ,
    find_run_dir,
    warn,
)
from hpclaunch.cli.run_cmd import with_options_named

if TYPE_CHECKING:
    from hpclaunch.records.runrecord import RunRecord


@click.command("cancel", epilog=RUN_ARG_HELP)
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: what was cancelled.")
@all_projects_option
def cancel_cmd(run: str, as_json: bool, all_projects: bool) -> int:
    """Cancel a run: scancel its Slurm job; for a local run, end its ranks (the
    hpclaunch process that supervises them records how the run ended). A sweep (its id,
    or `last` when a sweep is the newest) has every open point cancelled, a point
    (SWEEP:I) only itself, as `sweep cancel` does: on Slurm and locally alike."""
    from hpclaunch.backends import for_record, runstatus
    from hpclaunch.handle import Run
    from hpclaunch.records.refs import run_or_sweep, sweep_of

    found = run_or_sweep(run, environ(), warn, all_projects)
    if found.is_sweep:
        return _cancel_points(found.folder, None, as_json)
    record = runstatus.refresh_one(found.folder)
    point = sweep_of(found.folder)
    _check_cancellable(record, has_job=point is None)
    if point is not None:
        return _cancel_points(point[0], [point[1]], as_json)
    Run(found.folder).cancel()
    if as_json:
        click.echo(json.dumps({"cancelled": record.job_id, "run_id": record.run_id}))
    else:
        what = for_record(record.backend).kind
        click.echo(f"cancelled {what} {record.job_id} (run {record.run_id})")
    return 0


def _check_cancellable(record: RunRecord, has_job: bool) -> None:
    """A run must have a job (a sweep's point not started yet has none: it never starts),
    still open, and not a step of an allocation."""
    from hpclaunch.basics import states
    from hpclaunch.errors import UserError

    if has_job and not record.job_id:
        raise UserError("RUN", f"{record.run_id} has no job", "it was never started", "")
    if not states.is_open(record.state):
        raise UserError(
            "RUN", f"{record.run_id} has already ended ({record.state})", "", "Nothing to cancel"
        )
    if record.step:
        raise UserError(
            "RUN",
            f"{record.run_id} ran as a step of job {record.job_id}",
            "cancelling would end the whole allocation",
            "Press Ctrl-C in its terminal, or scancel the step yourself",
        )


def _cancel_points(folder: Path, points: Optional[list[int]], as_json: bool) -> int:
    """A sweep's open points (all, or those) as `sweep cancel` ends them: one call per
    array on Slurm; a local sweep's process records each one CANCELLED."""
    from hpclaunch.backends import sweepstate
    from hpclaunch.backends.runstatus import is_open
    from hpclaunch.errors import UserError
    from hpclaunch.records.runpaths import CANCELLED_FILE
    from hpclaunch.sweeps import ops

    sweep = sweepstate.refresh(folder)
    chosen = [
        r
        for r in sweep.points
        if is_open(r) and (points is None or int(r.extra.get("point", -1)) in points)
    ]
    if not chosen:
        counts = " ".join(f"{n} {s}" for s, n in sorted(sweep.counts().items()))
        raise UserError(
            "RUN", f"sweep {sweep.sweep_id} has already ended ({counts})", "", "Nothing to cancel"
        )
    for rec in chosen:  # asked for: a requeue or a local sweep starting it must not undo it
        with contextlib.suppress(OSError):
            (rec.path / CANCELLED_FILE).touch()
    done = ops.cancel(folder, points)
    if as_json and points is not None:  # a point: what a run's cancel says
        click.echo(json.dumps({"cancelled": chosen[0].job_id, "run_id": chosen[0].run_id}))
    elif as_json:
        click.echo(json.dumps({"cancelled": done, "run_id": sweep.sweep_id}))
    elif points is not None:
        click.echo(f"cancelled point {points[0]} of sweep {sweep.sweep_id} ({chosen[0].run_id})")
    else:
        click.echo(f"cancelled sweep {sweep.sweep_id}: {len(chosen)} open point(s)")
    return 0


# The run options a rerun may change: where and how long it runs, and its environment.
# The program and the code stay the recorded ones.
RERUN_OPTIONS = (
    "nodes", "tasks-per-node", "gpus-per-node", "time", "partition", "account", "env", "setup",
)  # fmt: skip


@click.command("rerun", epilog=RUN_ARG_HELP)
@click.argument("run")
@with_options_named(*RERUN_OPTIONS)
@click.option(
    "--current-code",
    is_flag=True,
    help="Run the project as it is now (a new snapshot), not the original run's snapshot.",
)
@click.option("--dry-run", is_flag=True, help="Print what would be submitted; submit nothing.")
@click.option("--wait", is_flag=True, help="Stay attached and exit with the job's code.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object; attached, a second line when the run ends (as run does).",
)
@all_projects_flag
def rerun_cmd(
    run: str, current_code: bool, dry_run: bool, wait: bool, as_json: bool, **changes: Any
) -> int:
    """Submit a new run of the same thing: the same options, program and folder, and by
    default the original run's code snapshot (edits made since do not count).

    The options below change the recorded ones (checked as `run` checks them): -N, -t,
    -p, -A, --tasks-per-node and --gpus-per-node replace the recorded value; --env adds
    to the recorded variables (the same NAME replaces its value); --setup lines run after
    the recorded ones.

    Secret values were never recorded: they come from your environment again."""
    from hpclaunch.api import request
    from hpclaunch.cli.reporting import run_and_report
    from hpclaunch.config import secretnames
    from hpclaunch.errors import UserError
    from hpclaunch.records import runrecord

    record = runrecord.load(find_run_dir(run))
    if (not record.options and "options" not in record.to_dict()) or not record.cwd:
        raise UserError(
            "RUN", f"{run} was recorded by an older hpclaunch", "no options in its record", ""
        )
    env = environ()
    options = _options_again(record.options, env)
    # Secret values masked as $NAME in the record come from the environment again.
    names = record.extra.get("masked_secrets") or []
    values = {str(n): env[str(n)] for n in names if str(n) in env}
    for name in names:
        if str(name) not in env:
            raise UserError(
                "RUN", f"{run} used the secret {name}, never recorded", "", f"export {name}=..."
            )
    options = with_changes(secretnames.masked_again(options, values), changes)
    reuse = None
    snap = record.code.get("snapshot") or {}
    if not current_code:
        if snap.get("dir") and Path(snap["dir"]).is_dir():
            reuse = Path(snap["dir"])
        else:
            click.echo(
                "hpclaunch: rerun: the run has no code snapshot; running the current code",
                err=True,
            )
    req = request(
        tuple(secretnames.masked_again(record.command, values)),
        options,
        cwd=Path(record.cwd),
        environ=env,
        argv=sys.argv,
        reuse_code=reuse,
    )
    return run_and_report(
        req, dry_run=dry_run, wait=wait, as_json=as_json, out=sys.stdout, err=sys.stderr
    )


def with_changes(recorded: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The recorded options with a rerun's changes on top: a value given replaces the
    recorded one; --env NAME[=VALUE] replaces the recorded NAME or adds it; --setup lines
    come after the recorded ones."""
    options = dict(recorded)
    for key, value in changes.items():
        if value is None or value == ():
            continue
        if key == "env":
            names = {item.partition("=")[0] for item in value}
            kept = [e for e in options.get("env", ()) if e.partition("=")[0] not in names]
            options["env"] = (*kept, *value)
        elif key == "setup":
            options["setup"] = (*options.get("setup", ()), *value)
        else:
            options[key] = value
    return options


def _options_again(recorded: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The recorded options; masked secrets come from the environment again (said so)."""
    from hpclaunch.config.jobspec import MASK

    options: dict[str, Any] = dict(recorded)
    for item in options.get("env", []):
        if item.endswith(f"={MASK}"):
            name = item.partition("=")[0]
            where = "taken from your environment" if name in env else "NOT SET now"
            click.echo(f"hpclaunch: rerun: {name} was a secret, not recorded: {where}", err=True)
    if "env" in options:
        # A masked secret is passed again by name (--env NAME): its value from here.
        options["env"] = tuple(
            e.partition("=")[0] if e.endswith(f"={MASK}") and e.partition("=")[0] in env else e
            for e in options["env"]
            if not e.endswith(f"={MASK}") or e.partition("=")[0] in env
        )
    for key, value in options.items():
        if isinstance(value, list):
            options[key] = tuple(value)
    return options
