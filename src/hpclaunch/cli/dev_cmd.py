"""`hpclaunch dev`: an interactive session in an allocation of its own (every run
option) or in a running run's (--run)."""

from __future__ import annotations

import sys
from typing import Any, Optional

import click

from hpclaunch.cli.run_cmd import with_options_named
from hpclaunch.config.options import OPTIONS

DEV_HELP = """Open an interactive session on a compute node, inside the run's allocation,
container, venv and environment: a shell (default), a Jupyter server or an SSH server
for VS Code (docs/interactive.md).

\b
Without --run, hpclaunch gets an allocation with the run options given (time limit:
--time, else the profile's dev_time, 2 h), waits for it, opens the session on its first
node and releases the allocation when the session ends. With --run RUN it joins that
running run's allocation and leaves the run alone.

\b
Examples:
  hpclaunch dev --gpus-per-node 1                       # a shell on a GPU node
  hpclaunch dev --container pytorch.sif -t 1:00:00      # a shell inside the image
  hpclaunch dev --run last -- nvidia-smi                # one command in a running run
"""


@click.command(
    "dev",
    help=DEV_HELP,
    context_settings={"allow_interspersed_args": False},
)
@with_options_named(*(opt.name for opt in OPTIONS))
@click.option("--shell", "mode", flag_value="shell", default=True, help="A shell (default).")
@click.option(
    "--run",
    "join",
    default=None,
    metavar="RUN",
    help="Join this running run's allocation instead of getting one.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND [ARGS]...]")
def dev_cmd(mode: str, join: Optional[str], command: tuple[str, ...], **options: Any) -> int:
    from pathlib import Path

    from hpclaunch.backends import runstatus
    from hpclaunch.cli.common import environ, find_run_dir
    from hpclaunch.sessions import allocation, shell

    env = environ()
    tty = sys.stdin.isatty() and not command
    if join is not None:
        record = runstatus.refresh_one(find_run_dir(join))
        return shell.run_shell(record, command, env, tty)
    run = allocation.start(options, Path.cwd(), env, sys.argv)
    try:
        click.echo(f"hpclaunch: session {run.id}: job {run.job_id}", err=True)
        record = allocation.wait_running(run.run_dir, lambda line: click.echo(line, err=True))
        click.echo(f"hpclaunch: on {allocation.node_of(record)}", err=True)
        return shell.run_shell(record, command, env, tty)
    finally:
        allocation.end(run)
