"""The `hpclaunch` click group: every command, and click's usage errors in hpclaunch's
one-line format. Imported only when a command runs here (main.py decides first whether
it runs on a remote cluster instead)."""

from __future__ import annotations

import click

from hpclaunch.cli.attach_cmd import attach_cmd
from hpclaunch.cli.clean_cmd import clean_cmd
from hpclaunch.cli.control import cancel_cmd, rerun_cmd
from hpclaunch.cli.dev_cmd import dev_cmd
from hpclaunch.cli.doctor_cmd import doctor_cmd
from hpclaunch.cli.env import env_group
from hpclaunch.cli.logs_cmd import logs_cmd
from hpclaunch.cli.plot_cmd import plot_cmd
from hpclaunch.cli.profile_cmd import profile_group
from hpclaunch.cli.records_cmds import runs_cmd, show_cmd, status_cmd
from hpclaunch.cli.remote_cmd import remote_group
from hpclaunch.cli.removal_cmds import gc_cmd, rm_cmd
from hpclaunch.cli.run_cmd import run_cmd
from hpclaunch.cli.stack_cmd import stack_cmd
from hpclaunch.cli.sweep_cmd import sweep_group
from hpclaunch.cli.top_cmd import top_cmd
from hpclaunch.errors import UserError, _one_line

EPILOG = """\b
Examples:
  hpclaunch run -N 2 --tasks-per-node 4 --wait -- python train.py --lr 3e-4
  hpclaunch run --cluster lumi -N 4 -A project_465000000 -t 1:00:00 --dry-run -- python train.py
  hpclaunch sweep --grid lr=0.1,0.01 --repeat 2 --max-parallel 4 -- python train.py --lr {lr}
  hpclaunch runs
  hpclaunch logs last --rank 0 --follow
  hpclaunch remote setup lumi && hpclaunch run --remote lumi -N 2 --wait -- python train.py

\b
Every command but `remote` takes --remote HOST (before any `--`): it then runs on that
cluster's login node over ssh, with this folder's code shipped for run and sweep.
"""


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EPILOG,
)
@click.version_option(package_name="hpclaunch", prog_name="hpclaunch")
def cli() -> None:
    """Run a training program unchanged on a Slurm cluster (LUMI or any site) or locally.

    The same command runs locally (no Slurm) with the same per-rank environment:
    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT,
    Slurm's own SLURM_* variables, HPCLAUNCH_RUN_DIR and HPCLAUNCH_CHECKPOINT_DIR.
    """


cli.add_command(run_cmd)
cli.add_command(runs_cmd)
cli.add_command(status_cmd)
cli.add_command(show_cmd)
cli.add_command(logs_cmd)
cli.add_command(cancel_cmd)
cli.add_command(env_group)
cli.add_command(rerun_cmd)
cli.add_command(clean_cmd)
cli.add_command(rm_cmd)
cli.add_command(gc_cmd)
cli.add_command(sweep_group)
cli.add_command(attach_cmd)
cli.add_command(dev_cmd)
cli.add_command(stack_cmd)
cli.add_command(doctor_cmd)
cli.add_command(top_cmd)
cli.add_command(plot_cmd)
cli.add_command(remote_group)
cli.add_command(profile_group)


def _usage_line(exc: click.UsageError) -> str:
    """click's usage errors in hpclaunch's one-line format."""
    if isinstance(exc, click.NoSuchOption):
        return _unknown_option(exc)
    if isinstance(exc, click.MissingParameter) and exc.param is not None:
        # Before BadParameter: click >= 8.2 makes MissingParameter one of them.
        name = str(exc.param.name).upper()
        return UserError(name, "missing", "", f"See {_help(exc)}").render()
    if isinstance(exc, click.BadParameter) and exc.param is not None:
        name = exc.param.opts[0] if exc.param.opts else str(exc.param.name)
        return UserError(name, exc.message, "", f"See {_help(exc)}").render()
    message = _one_line(exc.format_message()).rstrip(".")
    end = "" if message.endswith("?") else "."  # click's "Did you mean 'runs'?"
    return f"usage: {message}{end} See {_help(exc)}"


def _unknown_option(exc: click.NoSuchOption) -> str:
    """The closest option of the command typed (click's difflib matches), that command's
    help, and where a program goes for the commands that take one."""
    close = f"Did you mean {exc.possibilities[0]}? " if exc.possibilities else ""
    takes_program = exc.ctx is not None and any(p.name == "program" for p in exc.ctx.command.params)
    after = "; put the program after --" if takes_program else ""
    fix = f"{close}See {_help(exc)}{after}"
    return UserError(exc.option_name, "unknown option", "", fix).render()


def _help(exc: click.UsageError) -> str:
    """The help of the command typed: `hpclaunch sweep status --help`."""
    return " ".join(word for word in ("hpclaunch", _cmd(exc), "--help") if word)


def _cmd(exc: click.UsageError) -> str:
    """The command as typed after `hpclaunch` ("sweep status"), for the help hint; the
    hidden `sweep submit` is typed `sweep`."""
    if not exc.ctx or not exc.ctx.command:
        return ""
    ctx = exc.ctx
    if ctx.command.hidden and ctx.parent is not None:
        ctx = ctx.parent
    path = ctx.command_path.split(" ", 1)
    return path[1] if len(path) > 1 else ""
