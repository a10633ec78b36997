"""What the commands that work on recorded runs share: finding a run, warnings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

RUN_ARG_HELP = (
    "RUN is a run id, a unique prefix of one, a Slurm job id, or `last`; a point of a "
    "sweep is SWEEP:INDEX."
)


def environ() -> dict[str, str]:
    """The CLI's environment (read by the API's one reader) handed on to what runs."""
    from ..environ import environment

    return environment()


def warn(line: str) -> None:
    click.echo(f"hpclaunch: warning: {line}", err=True)


def find_run_dir(ref: str) -> Path:
    from .. import index

    if ":" in ref:  # SWEEP:INDEX: a point of a sweep, a run folder like any other
        from ..sweeps.ops import point_folder

        return point_folder(ref, environ())
    entry: dict[str, Any] = index.find(ref, environ(), warn)
    return Path(entry["run_dir"])
