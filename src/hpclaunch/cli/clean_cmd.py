"""`hpclaunch clean`: remove node-local leftovers of jobs that no longer run."""

from __future__ import annotations

import json

import click

from .common import environ


@click.command("clean")
@click.option("--dry-run", is_flag=True, help="List what would be removed.")
@click.option(
    "--folder",
    default="/tmp",
    show_default=True,
    help="Where node-local folders live (the profile's local_dir parent).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: what was removed.")
def clean_cmd(dry_run: bool, folder: str, as_json: bool) -> int:
    """Remove your node-local folders (FOLDER/<user>-hpclaunch-<jobid>) of jobs that no
    longer run, on this machine. The next staging step on a node does the same by itself;
    to clean every node of an allocation: srun --ntasks-per-node=1 hpclaunch clean.
    Nobody else's files and no running job's files are touched (squeue decides)."""
    from ..node.stage_guard import clean_leftovers, leftovers, live_jobs
    from ..users import user_name

    env = environ()
    user = user_name(env)
    if leftovers(folder, user, "") and live_jobs(user) is None:
        click.echo(
            "hpclaunch: clean: squeue does not answer, so it cannot tell which jobs still "
            "run; nothing removed",
            err=True,
        )
        return 1
    removed = clean_leftovers(folder, user, env.get("SLURM_JOB_ID", ""), dry_run)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "removed": removed}))
        return 0
    for path in removed:
        click.echo(("would remove " if dry_run else "removed ") + path)
    if not removed:
        click.echo(f"hpclaunch: clean: nothing to remove in {folder}", err=True)
    return 0
