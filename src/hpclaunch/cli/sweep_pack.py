"""`sweep --pack`'s options (sweeps/packing.py): the points packed into slots of whole
nodes. One decorator for the submitting command, and their values taken out of its
keyword arguments before the run options are read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS = [
    click.option(
        "--pack",
        is_flag=True,
        default=None,
        help="Pack the points into slots of -N whole nodes (one allocation, one srun step "
        "per node): a slot takes the next point when its point ends.",
    ),
    click.option("--gpus-per-point", type=int, metavar="G", help="--pack: a slot's GPUs (1)."),
    click.option("--cpus-per-point", type=int, metavar="C", help="--pack: a CPU slot's cores."),
    click.option("--tasks-per-point", type=int, metavar="T", help="--pack: each point's ranks."),
    click.option("--retries", type=int, metavar="R", help="--pack: a failed point's reruns (0)."),
    click.option("--point-time", metavar="TIME", help="--pack: a point running longer is ended."),
    click.option("--pack-jobs", type=int, metavar="K", help="--pack: K allocations of -N nodes."),
    click.option("--mem-per-point", metavar="SIZE", help="--pack: a point's memory bound."),
]
NAMES = ("pack", "gpus_per_point", "cpus_per_point", "tasks_per_point", "retries",
         "point_time", "pack_jobs", "mem_per_point")  # fmt: skip


def pack_options(command: F) -> F:
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def take_pack_options(options: dict[str, Any]) -> dict[str, Any]:
    """The --pack values given (SweepOptions' fields), removed from `options`."""
    taken = {name: options.pop(name, None) for name in NAMES}
    return {name: value for name, value in taken.items() if value is not None}


COMMANDS_OPTION = click.option(
    "--commands",
    metavar="FILE",
    help="With --pack: an ensemble, one command a line (quoted as a --configs .txt line), "
    "each a run of its own in the pack's slots.",
)


def run_commands(
    program: tuple[str, ...],
    commands: Optional[str],
    packed: dict[str, Any],
    given: dict[str, Any],
    *,
    dry_run: bool,
    wait: bool,
    as_json: bool,
) -> int:
    """`run --pack --commands FILE`: a packed sweep whose points are the file's lines.
    Each line is the whole command: the points' program is `env --`, which runs it."""
    import sys

    from hpclaunch.api import request
    from hpclaunch.cli.sweep_report import submit_and_report
    from hpclaunch.errors import UserError
    from hpclaunch.sweeps.plans import SweepOptions

    if not (packed.get("pack") and commands) or program:
        raise UserError(
            "--pack" if commands else "--commands",
            "run --pack takes --commands FILE and no program" if commands or program
            else "run --pack needs --commands FILE",
            "",
            "hpclaunch run --pack --commands FILE (or hpclaunch sweep --pack ... -- PROGRAM)",
        )  # fmt: skip
    given.setdefault("job_name", "commands")
    req = request(("env", "--"), given, argv=sys.argv)
    opts = SweepOptions(configs=commands, **packed)
    return submit_and_report(req, opts, dry_run=dry_run, wait=wait, as_json=as_json)
