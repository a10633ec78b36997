"""`hpclaunch clean`: remove node-local leftovers of jobs that no longer run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Optional

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
    """Remove your node-local folders (FOLDER/<user>-hpclaunch-<jobid>) of runs that no
    longer run, on this machine: a local run's folder when the hpclaunch process that
    ran it is gone, a Slurm job's when squeue no longer lists the job. The next staging
    step on a node does the same by itself; to clean every node of an allocation:
    srun --ntasks-per-node=1 hpclaunch clean. Nobody else's files and no running
    job's files are touched; what cannot be decided is left alone and said."""
    from ..node.stage_guard import leftovers
    from ..users import user_name

    env = environ()
    user = user_name(env)
    removed, undecided = _decide(leftovers(folder, user, env.get("SLURM_JOB_ID", "")), user)
    if not dry_run:
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "removed": removed, "kept": undecided}))
        return 0
    for path in removed:
        click.echo(("would remove " if dry_run else "removed ") + path)
    if undecided:
        click.echo(
            f"hpclaunch: clean: squeue does not answer, so it cannot tell whether the jobs "
            f"of {len(undecided)} folder(s) still run; left: {', '.join(undecided)}",
            err=True,
        )
        return 1
    if not removed:
        click.echo(f"hpclaunch: clean: nothing to remove in {folder}", err=True)
    return 0


def _decide(candidates: list[str], user: str) -> tuple[list[str], list[str]]:
    """(folders of runs that ended, folders nobody can tell about)."""
    from ..backends.local import OWNER
    from ..backends.watchdog import launcher_alive
    from ..node.stage_guard import LEFTOVER, live_jobs

    ended: list[str] = []
    slurm: list[str] = []
    for path in candidates:
        owner = _owner(Path(path) / OWNER)
        if owner is None:
            slurm.append(path)  # a Slurm job's folder: squeue decides
        elif not launcher_alive(*owner):
            ended.append(path)
    if not slurm:
        return ended, []
    live = live_jobs(user)
    if live is None:
        return ended, slurm
    for path in slurm:
        match = LEFTOVER.match(os.path.basename(path))
        if match is not None and match.group("job") not in live:
            ended.append(path)
    return ended, []


def _owner(marker: Path) -> Optional[tuple[int, float]]:
    """The launcher a local run's folder names (pid, start time), or None."""
    try:
        pid, started = marker.read_text(encoding="utf-8").split()
        return int(pid), float(started)
    except (OSError, ValueError):
        return None
