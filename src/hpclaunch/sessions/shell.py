"""`hpclaunch dev --shell`: the interactive shell of `attach`, on the session's first
node, inside the run's container (when it has one), venv and variables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hpclaunch.observe import attach
from hpclaunch.records.runrecord import RunRecord


def has_container(record: RunRecord) -> bool:
    return attach.container_of(attach.load_spec(record)) is not None


def plan(
    record: RunRecord, command: Sequence[str], environ: Mapping[str, str], tty: bool
) -> attach.Plan:
    """The step: the first node, in the image when the run has one (as its tasks were)."""
    target = attach.find_target(record, None)
    return attach.plan_attach(
        record, target, command, container=has_container(record), pty=tty, environ=environ
    )


def run_shell(
    record: RunRecord, command: Sequence[str], environ: Mapping[str, str], tty: bool
) -> int:
    """The shell (or COMMAND) as a child: the session releases the allocation after it."""
    code, _, _ = attach.call(plan(record, command, environ, tty))
    return code
