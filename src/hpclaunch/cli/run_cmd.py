"""`hpclaunch run`: click options from the registry, then the API's request, reported."""

from __future__ import annotations

from typing import Any, Callable

import click

from hpclaunch.cli.sweep_pack import COMMANDS_OPTION, pack_options
from hpclaunch.config.options import OPTIONS, Option

RUN_HELP = """Run PROGRAM [ARGS...] on N nodes with T ranks each.

\b
Everything after `--` reaches every rank byte for byte (spaces, quotes, $, newlines).
Per-rank placeholders are expanded without a shell: {rank}, {local_rank},
{world_size}, {local_world_size}, {node_rank}, {master_addr}, {master_port};
write {{rank}} for a literal {rank}.

\b
Without --wait the command prints the run id and job id and returns; with --wait it
streams every rank's output as `[node rank] text` and exits with the job's code:
0 done, the first failing rank's code, 128+N for a signal, 143 CANCELLED,
122 NODE_FAIL, 123 OUT_OF_MEMORY, 124 TIMEOUT, 125 other Slurm failure, 130 Ctrl-C, 2 bad request.
The local backend always waits. Inside an allocation (salloc) the job runs as a step.
"""


def _click_option(opt: Option) -> Callable[[Any], Any]:
    names = [f"--{opt.name}"] + ([opt.short] if opt.short else [])
    help_text = f"{opt.help} Example: {opt.example}" if opt.example else opt.help
    if opt.kind == "flag":
        return click.option(*names, opt.dest, is_flag=True, default=None, help=help_text)
    if opt.kind == "list":
        return click.option(*names, opt.dest, multiple=True, metavar=opt.metavar, help=help_text)
    if opt.kind == "choice":
        return click.option(
            *names, opt.dest, type=click.Choice(opt.choices), default=None, help=help_text
        )
    return click.option(*names, opt.dest, default=None, metavar=opt.metavar, help=help_text)


def _with_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(OPTIONS):
        func = _click_option(opt)(func)
    return func


def with_options_named(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Some of `run`'s options, declared by the same rows (`rerun` takes these again)."""
    chosen = [opt for opt in OPTIONS if opt.name in names]
    assert len(chosen) == len(names), f"no such run options: {names}"

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for opt in reversed(chosen):
            func = _click_option(opt)(func)
        return func

    return decorate


@click.command(
    "run",
    help=RUN_HELP,
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": False},
)
@_with_options
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the batch script and the sbatch command; submit nothing, write nothing.",
)
@click.option(
    "--wait",
    is_flag=True,
    help="Stay attached: show the queue state, stream the "
    "output, exit with the job's exit code. Ctrl-C detaches; the job keeps running.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object (run id, job id, "
    "run directory; with --dry-run the script and command); attached (--wait, or a local "
    "run) a second line when the run ends: state, exit code (docs/json.md).",
)
@pack_options
@COMMANDS_OPTION
@click.argument("program", nargs=-1, type=click.UNPROCESSED, metavar="-- PROGRAM [ARGS]...")
def run_cmd(
    program: tuple[str, ...], dry_run: bool, wait: bool, as_json: bool, **options: Any
) -> int:
    import sys

    from hpclaunch.api import request
    from hpclaunch.cli.reporting import run_and_report
    from hpclaunch.cli.sweep_pack import run_commands, take_pack_options

    packed, commands = take_pack_options(options), options.pop("commands", None)
    given = {k: v for k, v in options.items() if v is not None and v != ()}
    if packed or commands:  # an ensemble in a pack's slots (cli/sweep_pack.py)
        return run_commands(
            program, commands, packed, given, dry_run=dry_run, wait=wait, as_json=as_json
        )
    req = request(program, given, argv=sys.argv)
    if req.environ.get("HPCLAUNCH_WANDB_POINT") and not dry_run:
        # The command of a W&B sweep, run by `wandb agent` inside a sweep point: the
        # point's own job.sh starts every rank with this program line.
        from hpclaunch.sweeps.wandb import run_point

        return run_point(program, req.environ)
    return run_and_report(
        req, dry_run=dry_run, wait=wait, as_json=as_json, out=sys.stdout, err=sys.stderr
    )
