"""`hpclaunch rerun` (the same run again) and `hpclaunch clean` (node-local leftovers)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from .manage import RUN_ARG_HELP


@click.command("rerun", epilog=RUN_ARG_HELP)
@click.argument("run")
@click.option(
    "--current-code",
    is_flag=True,
    help="Run the project as it is now (a new snapshot), not the original run's snapshot.",
)
@click.option("--dry-run", is_flag=True, help="Print what would be submitted; submit nothing.")
@click.option("--wait", is_flag=True, help="Stay attached and exit with the job's code.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def rerun_cmd(run: str, current_code: bool, dry_run: bool, wait: bool, as_json: bool) -> int:
    """Submit a new run of the same thing: the same options, program and folder, and by
    default the original run's code snapshot (edits made since do not count).

    Secret values were never recorded: they come from your environment again."""
    from .. import runs
    from ..errors import UserError
    from ..run import RunRequest, execute
    from ..spec import MASK

    record = runs.read_record(Path(runs.find(run)["run_dir"]))
    if "options" not in record or "cwd" not in record:
        raise UserError(
            "RUN", f"{run} was recorded by an older hpclaunch", "no options in its record", ""
        )
    options: dict[str, Any] = dict(record["options"])
    env = [e for e in options.get("env", []) if not e.endswith(f"={MASK}")]
    for item in options.get("env", []):
        if item.endswith(f"={MASK}"):
            name = item.partition("=")[0]
            where = "taken from your environment" if name in os.environ else "NOT SET now"
            click.echo(f"hpclaunch: rerun: {name} was a secret, not recorded: {where}", err=True)
    if "env" in options:
        options["env"] = tuple(env)
    for key, value in options.items():
        if isinstance(value, list):
            options[key] = tuple(value)
    reuse = None
    snap = (record.get("code") or {}).get("snapshot") or {}
    if not current_code:
        if snap.get("dir") and Path(snap["dir"]).is_dir():
            reuse = Path(snap["dir"])
        else:
            click.echo(
                "hpclaunch: rerun: the run has no code snapshot; running the current code",
                err=True,
            )
    return execute(
        RunRequest(
            options=options,
            program=tuple(record["command"]),
            cwd=Path(record["cwd"]),
            reuse_code=reuse,
            dry_run=dry_run,
            wait=wait,
            as_json=as_json,
        )
    )


@click.command("clean")
@click.option("--dry-run", is_flag=True, help="List what would be removed.")
@click.option(
    "--folder",
    default="/tmp",
    show_default=True,
    help="Where node-local folders live (the profile's local_dir parent).",
)
def clean_cmd(dry_run: bool, folder: str) -> int:
    """Remove your node-local folders (FOLDER/$USER-hpclaunch-<jobid>) of jobs that no
    longer run, on this machine. The next staging step on a node does the same by itself;
    to clean every node of an allocation: srun --ntasks-per-node=1 hpclaunch clean.
    Nobody else's files and no running job's files are touched (squeue decides)."""
    from ..stage_node import clean_leftovers, leftovers, live_jobs

    user = os.environ.get("USER") or ""
    if not user:
        click.echo("hpclaunch: error: USER: not set. Set it to your user name", err=True)
        sys.exit(2)
    if leftovers(folder, user, "") and live_jobs(user) is None:
        click.echo(
            "hpclaunch: clean: squeue does not answer, so it cannot tell which jobs still "
            "run; nothing removed",
            err=True,
        )
        return 1
    removed = clean_leftovers(folder, user, os.environ.get("SLURM_JOB_ID", ""), dry_run)
    for path in removed:
        click.echo(("would remove " if dry_run else "removed ") + path)
    if not removed:
        click.echo(f"hpclaunch: clean: nothing to remove in {folder}", err=True)
    return 0
