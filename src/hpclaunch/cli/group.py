"""The `hpclaunch` click group: every command, and click's usage errors in hpclaunch's
one-line format. Imported only when a command runs here (main.py decides first whether
it runs on a remote cluster instead)."""

from __future__ import annotations

from typing import Optional

import click

from hpclaunch.errors import UserError, _one_line

# Each command's module, imported only when that command runs (or its help is shown):
# importing all of them cost `hpclaunch sweep` about a third of its start-up (-X importtime:
# 162 ms for the whole group against 97 ms for the sweep command's module alone).
# click's documented pattern: https://click.palletsprojects.com/en/stable/complex/#lazily-loading-subcommands
COMMANDS = {
    "run": "hpclaunch.cli.run_cmd:run_cmd",
    "runs": "hpclaunch.cli.records_cmds:runs_cmd",
    "status": "hpclaunch.cli.records_cmds:status_cmd",
    "show": "hpclaunch.cli.records_cmds:show_cmd",
    "logs": "hpclaunch.cli.logs_cmd:logs_cmd",
    "cancel": "hpclaunch.cli.control:cancel_cmd",
    "env": "hpclaunch.cli.env:env_group",
    "rerun": "hpclaunch.cli.control:rerun_cmd",
    "clean": "hpclaunch.cli.clean_cmd:clean_cmd",
    "rm": "hpclaunch.cli.removal_cmds:rm_cmd",
    "gc": "hpclaunch.cli.removal_cmds:gc_cmd",
    "sweep": "hpclaunch.cli.sweep_cmd:sweep_group",
    "attach": "hpclaunch.cli.attach_cmd:attach_cmd",
    "dev": "hpclaunch.cli.dev_cmd:dev_cmd",
    "stack": "hpclaunch.cli.stack_cmd:stack_cmd",
    "doctor": "hpclaunch.cli.doctor_cmd:doctor_cmd",
    "top": "hpclaunch.cli.top_cmd:top_cmd",
    "plot": "hpclaunch.cli.plot_cmd:plot_cmd",
    "remote": "hpclaunch.cli.remote_cmd:remote_group",
    "profile": "hpclaunch.cli.profile_cmd:profile_group",
    "image": "hpclaunch.cli.image_cmd:image_group",
}


class LazyGroup(click.Group):
    """A click group whose commands (COMMANDS: name -> "module:attribute") are imported
    when first asked for; listed by name, as click lists them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            import importlib

            module, _, attribute = COMMANDS[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[Optional[str], Optional[click.Command], list[str]]:
        """click's "No such command" offers the close names among the commands loaded so
        far (``self.commands``): offer them among all."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            name = getattr(exc, "command_name", None)  # click >= 8.2's NoSuchCommand
            if name is None:
                raise
            raise type(exc)(name, possibilities=list(COMMANDS), ctx=ctx) from None  # type: ignore[call-arg]


def every_command(
    group: click.Group, ctx: Optional[click.Context] = None
) -> dict[str, click.Command]:
    """Every command of a group by name, each imported (for tests and docs that walk the
    whole command tree: a lazy group's ``commands`` holds only those used so far)."""
    ctx = ctx or click.Context(group)
    found = {}
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is not None:
            found[name] = command
    return found


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
    cls=LazyGroup,
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
