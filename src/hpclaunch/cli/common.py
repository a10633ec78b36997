"""What the commands that work on recorded runs share: finding a run, warnings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, TextIO

import click

RUN_ARG_HELP = (
    "RUN is a run id, a unique prefix of one, a Slurm job id, a run folder, or `last`; a "
    "point of a sweep is SWEEP:INDEX (or its Slurm ARRAY_TASK id). `last` is the newest run "
    "or sweep started: of a sweep, its most recently started point (cancel: the whole sweep)."
)
RUN_OR_LAST = (
    "RUN is a run id, a unique prefix of one, a Slurm job id, a run folder, or `last` (the "
    "default); a point of a sweep is SWEEP:INDEX (or its Slurm ARRAY_TASK id). `last` is "
    "this project's newest run or sweep (--all-projects: anyone's): of a sweep, its most "
    "recently started point."
)


def environ() -> dict[str, str]:
    """The CLI's environment (read by the API's one reader) handed on to what runs."""
    from hpclaunch.basics.environ import environment

    return environment()


def warn(line: str) -> None:
    click.echo(f"hpclaunch: warning: {line}", err=True)


def find_run_dir(ref: str, all_projects: bool = False) -> Path:
    """RUN -> its run folder (refs.run_dir's rules)."""
    from hpclaunch.records.refs import run_dir

    return run_dir(ref, environ(), warn, all_projects or all_projects_asked())


#: `last` is this project's newest run; the commands that default to it take this.
all_projects_option = click.option(
    "--all-projects",
    is_flag=True,
    help="`last` is the newest run of any project, not of this one.",
)

_ALL_PROJECTS = "hpclaunch.all_projects"


def _remember(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[_ALL_PROJECTS] = True  # meta is shared by the whole command line
    return value


#: The same flag for every other command that takes RUN or SWEEP: the finders below
#: read it from the command line's context, so the commands' functions need not carry it.
all_projects_flag = click.option(
    "--all-projects",
    is_flag=True,
    expose_value=False,
    callback=_remember,
    help="`last` is the newest run or sweep of any project, not of this one.",
)


def all_projects_asked() -> bool:
    """Whether the command line running now gave --all-projects (all_projects_flag)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(_ALL_PROJECTS))


def find_sweep_dir(ref: str) -> Path:
    """SWEEP -> its sweep folder (refs.sweep_dir's rules)."""
    from hpclaunch.records.refs import sweep_dir

    return sweep_dir(ref, environ(), all_projects_asked())


def state_colour(word: str) -> Optional[str]:
    """A state's colour: COMPLETED green, CANCELLED yellow, any other end (FAILED,
    TIMEOUT, OUT_OF_MEMORY, ...) red; None for a state that may still change."""
    from hpclaunch.basics import states

    names = {s.value for s in states.State} - {states.State.UNKNOWN.value}
    if word not in names or states.is_open(word):
        return None
    if word == states.State.COMPLETED.value:
        return "green"
    return "yellow" if word == states.State.CANCELLED.value else "red"


def coloured_states(text: str) -> str:
    """Every state word of text in its colour (a sweep's "2 COMPLETED 1 FAILED" word by
    word). click.echo drops the colours where its output is no terminal; NO_COLOR
    (no-color.org) set: none at all."""
    if environ().get("NO_COLOR"):
        return text

    def paint(match: re.Match[str]) -> str:
        colour = state_colour(match.group(0))
        return click.style(match.group(0), fg=colour) if colour else match.group(0)

    return re.sub(r"[A-Z_]+", paint, text)


def painted(text: str, stream: TextIO) -> str:
    """text with its state words in colour where `stream` is a terminal (NO_COLOR unset):
    the summary lines written straight to a stream, which click.echo does not see."""
    return coloured_states(text) if stream.isatty() else text
