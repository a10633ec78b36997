"""What the commands that work on recorded runs share: finding a run, warnings."""

from __future__ import annotations

from pathlib import Path

import click

RUN_ARG_HELP = (
    "RUN is a run id, a unique prefix of one, a Slurm job id, a run folder, or `last`; a "
    "point of a sweep is SWEEP:INDEX (or its Slurm ARRAY_TASK id). `last` is the newest run "
    "or sweep started: of a sweep, its most recently started point (cancel: the whole sweep)."
)


def environ() -> dict[str, str]:
    """The CLI's environment (read by the API's one reader) handed on to what runs."""
    from hpclaunch.basics.environ import environment

    return environment()


def warn(line: str) -> None:
    click.echo(f"hpclaunch: warning: {line}", err=True)


def find_run_dir(ref: str) -> Path:
    """RUN -> its run folder (refs.run_dir's rules)."""
    from hpclaunch.records.refs import run_dir

    return run_dir(ref, environ(), warn)


def find_sweep_dir(ref: str) -> Path:
    """SWEEP -> its sweep folder (refs.sweep_dir's rules)."""
    from hpclaunch.records.refs import sweep_dir

    return sweep_dir(ref, environ())
