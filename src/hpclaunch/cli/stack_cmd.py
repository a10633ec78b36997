"""`hpclaunch stack`: every running rank's Python stack (py-spy), equal stacks once."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Optional

import click

from hpclaunch.cli.common import RUN_ARG_HELP, all_projects_flag, environ, find_run_dir

if TYPE_CHECKING:
    from hpclaunch.observe.stacks import Group, Target
    from hpclaunch.records.runrecord import RunRecord


@click.command("stack", epilog=RUN_ARG_HELP)
@click.argument("run")
@click.option("--rank", type=int, default=None, help="Only this rank's stack.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the groups of ranks.")
@all_projects_flag
def stack_cmd(run: str, rank: Optional[int], as_json: bool) -> int:
    """Print the Python stack of every rank of a running run (py-spy dump, taken on each
    node inside the job, inside the container where the ranks run), most recent call
    first. Ranks with the same stack are shown once, with their rank list.

    Needs py-spy where the nodes can run it: pip install 'hpclaunch[stack]'.
    Exit code 0 when every asked rank's stack was taken, else 1."""
    from hpclaunch.backends import runstatus
    from hpclaunch.observe import stacks

    record = runstatus.refresh_one(find_run_dir(run))
    targets, ended = _asked(record, rank)
    env = environ()
    items = stacks.collect(record, targets, env)
    groups = stacks.group(items)
    missing = stacks.missing_on(items)
    if as_json:
        data = {
            "run_id": record.run_id,
            "job_id": record.job_id,
            "state": record.state,
            "groups": [g.to_dict() for g in groups],
            "ended": {str(r): code for r, code in sorted(ended.items())},
            "missing_pyspy": missing,
        }
        click.echo(json.dumps(data))
    else:
        _print(record.run_id, str(record.job_id), groups, ended)
    if missing:
        click.echo(
            f"hpclaunch: hint: py-spy is missing on {', '.join(missing)}: {stacks.PYSPY_FIX}",
            err=True,
        )
    return 1 if any(g.error for g in groups) else 0


def _print(run_id: str, job_id: str, groups: list[Group], ended: dict[int, int]) -> None:
    from hpclaunch.observe.stacks import rank_list, render

    ranks = sum(len(g.ranks) for g in groups)
    kinds = sum(1 for g in groups if not g.error)
    head = f"run {run_id} (job {job_id}): {ranks} rank{'s' * (ranks != 1)}"
    click.echo(f"{head}, {kinds} distinct stack{'s' * (kinds != 1)} (most recent call first)")
    click.echo("")
    for line in render(groups):
        click.echo(line)
    if len(ended) == 1:
        [(one, code)] = ended.items()
        click.echo(f"\nended: rank {one} (exit code {code})")
    elif ended:
        codes = ", ".join(f"{r}: {c}" for r, c in sorted(ended.items()))
        click.echo(f"\nended: ranks {rank_list(ended)} (exit codes {codes})")


def _asked(record: RunRecord, rank: Optional[int]) -> tuple[list[Target], dict[int, int]]:
    """The running ranks to look at, and those that have ended; a run or rank that has
    nothing running is refused in one line."""
    from hpclaunch.basics import states
    from hpclaunch.errors import UserError
    from hpclaunch.observe import stacks

    rid, state = record.run_id, record.state
    if rank is not None and (rank < 0 or (record.world_size and rank >= record.world_size)):
        top = f"0 to {record.world_size - 1}" if record.world_size else "at least 0"
        raise UserError("--rank", f"{rank}", f"{rid} has ranks {top}", "Pick one of them")
    why = "a stack is taken from running ranks"
    if not states.is_open(state):
        raise UserError("RUN", f"{rid} has ended: {state}", why, f"See hpclaunch logs {rid}")
    if not states.is_streaming(state):
        raise UserError(
            "RUN", f"{rid} is {state}", why, f"Try again once it runs (hpclaunch status {rid})"
        )
    running, ended = stacks.rank_tasks(record)
    if rank is not None:
        if rank in ended:
            raise UserError(
                "--rank",
                f"rank {rank} of {rid} has ended (exit code {ended[rank]})",
                why,
                "Pick a running rank",
            )
        if rank not in running:
            raise UserError(
                "--rank", f"rank {rank} of {rid} has not started yet", why, "Try again in a moment"
            )
        return [running[rank]], {}
    if not running:
        what = "every rank has ended" if ended else "no rank has started yet"
        raise UserError("RUN", f"{rid} is {state} but {what}", why, f"See hpclaunch logs {rid}")
    return [running[r] for r in sorted(running)], ended
