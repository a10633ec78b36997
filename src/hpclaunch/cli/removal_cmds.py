"""`hpclaunch rm` and `hpclaunch gc`: delete recorded runs and sweeps (their folders and
index lines; records/removal.py), never an active one. Both list what they would
delete, ask on a terminal, and need --yes without one (CI has no stdin to ask on)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import click

from hpclaunch.cli.common import all_projects_asked, all_projects_flag, environ, warn
from hpclaunch.records.removal import Doomed

YES_HELP = "Delete without asking (needed where stdin is no terminal)."


@click.command("rm")
@click.argument("runs", nargs=-1, required=True, metavar="RUN...")
@click.option("--yes", "-y", is_flag=True, help=YES_HELP)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: what was deleted.")
@all_projects_flag
def rm_cmd(runs: tuple[str, ...], yes: bool, as_json: bool) -> int:
    """Delete runs and sweeps (a sweep with its points): their folders and their lines in
    the index. An active run (PENDING, RUNNING, ...) is refused and nothing is deleted.
    RUN is a run or sweep id, a unique prefix, a job id, a folder, or `last`; a single
    point of a sweep cannot be deleted, only the whole sweep. Checkpoints kept outside
    the run folder (a checkpoint root) are not deleted."""
    from hpclaunch.errors import UserError
    from hpclaunch.records import refs, removal

    env = environ()
    folders: dict[Path, bool] = {}
    for ref in runs:
        found = refs.run_or_sweep(ref, env, warn, all_projects_asked())
        point = None if found.is_sweep else refs.sweep_of(found.folder)
        if point is not None:
            sweep_id = point[0].name
            raise UserError(
                "RUN",
                f"{ref} is point {point[1]} of sweep {sweep_id}",
                "a sweep is deleted whole",
                f"hpclaunch rm {sweep_id}",
            )
        folders[found.folder] = found.is_sweep
    doomed = _as_of_now(folders)
    removal.refuse_open(doomed)
    return _delete(doomed, yes, as_json)


@click.command("gc")
@click.option(
    "--older-than",
    default="30d",
    show_default=True,
    metavar="AGE",
    help="Only runs and sweeps started longer ago: N with s, m, h, d or w (30d, 12h).",
)
@click.option("--state", default=None, help="Only runs in this state (a sweep: any point).")
@click.option("--exp", default=None, help="Only runs of this experiment.")
@click.option("--yes", "-y", is_flag=True, help=YES_HELP)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: what was deleted.")
def gc_cmd(
    older_than: str, state: Optional[str], exp: Optional[str], yes: bool, as_json: bool
) -> int:
    """Delete old runs and sweeps you recorded (their folders and index lines): those
    started more than --older-than ago, of --exp, in --state. Active ones are kept.
    `hpclaunch clean` is another job: node-local folders and the stage cache."""
    from hpclaunch.api import check_state
    from hpclaunch.records import index, removal

    older_s = removal.parse_age(older_than)
    wanted = check_state(state) if state else None
    # Only lines old enough are read and asked about (one refresh for all of them).
    old = removal.collectable(
        [_unknown(e) for e in index.live(environ(), warn) if not exp or e.get("exp") == exp],
        older_s,
        None,
    )
    doomed = removal.collectable(_as_of_now({d.folder: d.is_sweep for d in old}), older_s, wanted)
    return _delete(doomed, yes, as_json)


def _unknown(entry: dict[str, Any]) -> Doomed:
    """An index line before its record is read (its state not known yet)."""
    from hpclaunch.records import removal

    return Doomed(
        str(entry["run_id"]),
        Path(entry["run_dir"]),
        bool(entry.get("sweep")),
        "",
        False,
        removal.started_at(entry),
    )


def _as_of_now(folders: dict[Path, bool]) -> list[Doomed]:
    """These runs and sweeps with their states brought up to date in one refresh (one
    squeue, at most one sacct); a damaged record is said and skipped."""
    from hpclaunch.backends import runstatus, sweepstate
    from hpclaunch.records import runrecord, sweeprecord
    from hpclaunch.records.removal import started_at

    plain, sweeps = [], []
    for folder, is_sweep in folders.items():
        try:
            if is_sweep:
                sweeps.append(sweepstate.load(folder))
            else:
                plain.append(runrecord.load(folder))
        except (runrecord.DamagedRecord, sweeprecord.DamagedSweep) as exc:
            warn(f"{exc}; not deleted")
    out = []
    for rec in sweepstate.refresh_with_runs(sweeps, plain):
        is_open = runstatus.is_open(rec)
        when = started_at({"submitted_at": rec.submitted_at, "run_id": rec.run_id})
        out.append(Doomed(rec.run_id, rec.path, False, rec.state, is_open, when))
    for sweep in sweeps:
        active = [r.state for r in sweep.points if runstatus.is_open(r)]
        counts = ", ".join(f"{n} {s}" for s, n in sorted(sweep.counts().items()))
        when = started_at({"run_id": sweep.sweep_id, **_submitted(sweep.data)})
        state = active[0] if active else counts
        out.append(Doomed(sweep.sweep_id, sweep.sweep_dir, True, state, bool(active), when))
    return out


def _submitted(data: dict[str, Any]) -> dict[str, Any]:
    value = data.get("submitted_at")
    return {"submitted_at": value} if value is not None else {}


def _delete(doomed: list[Doomed], yes: bool, as_json: bool) -> int:
    """List, ask (or --yes), delete; one JSON object with --json."""
    from hpclaunch.errors import UserError
    from hpclaunch.records import removal

    for item in doomed:  # with --json on stderr: stdout carries the one object
        click.echo(item.line(), err=as_json)
    if not doomed:
        if as_json:
            click.echo(json.dumps({"deleted": [], "kept": []}))
        else:
            click.echo("nothing to delete", err=True)
        return 0
    if not yes:
        if not sys.stdin.isatty():
            raise UserError(
                "--yes",
                "not given",
                f"{len(doomed)} to delete and no terminal to ask on",
                "Add --yes to delete them",
            )
        if not click.confirm(f"delete these {len(doomed)}?", default=False, err=True):
            click.echo("nothing deleted", err=True)
            return 1
    deleted, problems = removal.delete(doomed, environ())
    for line in problems:
        warn(line)
    if as_json:
        click.echo(json.dumps({"deleted": [d.as_json() for d in deleted], "kept": problems}))
    else:
        click.echo(f"deleted {len(deleted)} of {len(doomed)}")
    return 1 if problems else 0
