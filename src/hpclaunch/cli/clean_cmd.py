"""`hpclaunch clean`: remove node-local leftovers of jobs that no longer run."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Optional

import click

from hpclaunch.cli.common import environ


@click.command("clean")
@click.option("--dry-run", is_flag=True, help="List what would be removed.")
@click.option(
    "--folder",
    default=None,
    help="Where node-local folders live (the profile's local_dir; default $TMPDIR or /tmp).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: what was removed.")
@click.option(
    "--stage-cache",
    is_flag=True,
    help="Instead: empty the stage cache (RUN_ROOT/.stage-cache), but packs in use.",
)
@click.option(
    "--run-root",
    default="runs",
    show_default=True,
    help="With --stage-cache: the run root whose cache to empty (your profile's run_root).",
)
def clean_cmd(
    dry_run: bool, folder: Optional[str], as_json: bool, stage_cache: bool, run_root: str
) -> int:
    """Remove your node-local folders (FOLDER/hpclaunch-<jobid>.<random>, and local runs'
    FOLDER/hpclaunch-local-<id>-p<pid>.<random>) and broadcast copies (of files and
    container images sent with sbcast: FOLDER/hpclaunch-bcast-<jobid>.<random>.<n>) of
    runs that no longer run, on this machine: a local run's folder when the hpclaunch
    process that ran it is gone, a Slurm job's when squeue no longer lists the job. The
    next staging step on a node does the same for Slurm jobs by itself; to clean every
    node of an allocation: srun --ntasks-per-node=1 hpclaunch clean. Only folders and
    files you own are touched, never a running job's or run's; what cannot be decided is
    left alone and said.

    Local leftovers: a local run removes its node-local folder itself when it ends
    (completed, failed, cancelled or Ctrl-C). Only a local run whose hpclaunch process
    was killed (SIGKILL, a crash, a reboot) leaves its folder behind, and nothing but
    this command removes it. Run folders and records are not touched: delete those with
    hpclaunch rm or hpclaunch gc.

    With --stage-cache: remove every pack of the stage cache but those a queued or
    running job uses (one squeue call) or a run started in the last minute."""
    from hpclaunch.basics.users import user_name
    from hpclaunch.node.stage_guard import leftovers, remove_leftover

    env = environ()
    if stage_cache:
        return _clean_stage_cache(Path(run_root).absolute(), dry_run, as_json, env)
    user = user_name(env)
    folder = folder or tempfile.gettempdir()
    found = leftovers(folder, env.get("SLURM_JOB_ID", ""), local=True)
    removed, undecided = _decide(found, user)
    if not dry_run:
        for path in removed:
            remove_leftover(path)
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


def _clean_stage_cache(run_root: Path, dry_run: bool, as_json: bool, env: dict[str, str]) -> int:
    """`clean --stage-cache`: every pack goes but those in use; nothing when squeue
    cannot tell which are."""
    from hpclaunch.payload.snapshot import human
    from hpclaunch.payload.stage import CACHE
    from hpclaunch.payload.stagecache import check_existing, empty

    cache = run_root / CACHE
    check_existing(cache)  # a cache others can write is refused, not emptied
    done = empty(cache, env, dry_run)
    if done is None:
        click.echo(
            f"hpclaunch: clean: squeue does not answer, so it cannot tell which packs of "
            f"{cache} queued or running jobs use; nothing removed",
            err=True,
        )
        return 1
    removed, kept = done
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "removed": [p.path for p in removed],
                               "kept": [p.path for p in kept]}))  # fmt: skip
        return 0
    for pack in removed:
        click.echo(f"{'would remove' if dry_run else 'removed'} {pack.path} ({human(pack.size)})")
    if kept:
        click.echo(
            f"hpclaunch: clean: kept {len(kept)} pack(s) in use (a queued or running job's, "
            f"or a run's started this minute): {', '.join(p.path for p in kept)}",
            err=True,
        )
    if not removed and not kept:
        click.echo(f"hpclaunch: clean: the stage cache {cache} holds no pack", err=True)
    return 0


def _decide(candidates: list[str], user: str) -> tuple[list[str], list[str]]:
    """(folders of runs that ended, folders nobody can tell about)."""
    from hpclaunch.node.stage_guard import LEFTOVER, live_jobs

    ended: list[str] = []
    slurm: list[str] = []
    for path in candidates:
        match = LEFTOVER.match(os.path.basename(path))
        if match is None:
            continue
        if match.group("local") is None:
            slurm.append(path)  # a Slurm job's folder: squeue decides
        elif not _local_run_alive(Path(path), int(match.group("pid"))):
            ended.append(path)
    if not slurm:
        return ended, []
    live = live_jobs(user or str(os.getuid()))
    if live is None:
        return ended, slurm
    for path in slurm:
        match = LEFTOVER.match(os.path.basename(path))
        if match is not None and match.group("job") not in live:
            ended.append(path)
    return ended, []


def _local_run_alive(folder: Path, pid: int) -> bool:
    """Whether the launcher of a local run's folder still runs: the marker it wrote first
    (pid and start time: a reused pid is not taken for it), else the pid in the name
    (the marker is written right after the folder is made)."""
    from hpclaunch.backends.local import OWNER
    from hpclaunch.backends.localreaper import launcher_alive

    owner = _owner(folder / OWNER)
    if owner is not None:
        return launcher_alive(*owner)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(marker: Path) -> Optional[tuple[int, float]]:
    """The launcher a local run's folder names (pid, start time), or None."""
    try:
        pid, started = marker.read_text(encoding="utf-8").split()
        return int(pid), float(started)
    except (OSError, ValueError):
        return None
