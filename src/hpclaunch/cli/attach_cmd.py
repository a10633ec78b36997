"""`hpclaunch attach`: a shell (or a command) on a node of a running job."""

from __future__ import annotations

import json
import sys
from typing import Optional

import click

from hpclaunch.cli.common import RUN_ARG_HELP, all_projects_flag, environ, find_run_dir

ATTACH_HELP = """Open a shell (or run COMMAND) on a node of a running job, inside its
allocation: an srun step beside the ranks (--overlap), on the job's first node unless
--node says another. With --container the shell or command runs inside the job's image,
with its binds, as the job's tasks do.

On a terminal you get an interactive session (srun --pty). Without one, COMMAND runs
with hpclaunch's stdin and hpclaunch exits with its exit code (scripts, tests).
A run that has ended, or waits in the queue (also between two --requeue attempts), is
refused.

\b
Examples:
  hpclaunch attach last                              # a login shell on the first node
  hpclaunch attach last --node node2 -- nvidia-smi   # one command, its exit code
  hpclaunch attach last --container -- python -c 'import torch; print(torch.__version__)'
  hpclaunch attach 20261123-115833-096-4782:4 -- py-spy dump --pid 1234
"""


@click.command("attach", help=ATTACH_HELP, epilog=RUN_ARG_HELP)
@click.argument("run")
@click.option(
    "--node", default=None, metavar="NODE", help="One of the job's nodes (default: the first)."
)
@click.option(
    "--container",
    is_flag=True,
    help="Inside the job's container, with its binds, venv and variables.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="With COMMAND: one JSON object (run_id, job_id, node, exit_code, stdout, stderr).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND [ARGS]...]")
@all_projects_flag
def attach_cmd(
    run: str, node: Optional[str], container: bool, as_json: bool, command: tuple[str, ...]
) -> int:
    from hpclaunch.backends import runstatus
    from hpclaunch.errors import UserError
    from hpclaunch.observe import attach

    if as_json and not command:
        raise UserError(
            "--json",
            "given without COMMAND",
            "an interactive shell has no result",
            "Add -- COMMAND",
        )
    if node is not None and not node.strip():
        raise UserError("--node", "is empty", "", "Give one of the job's node names")
    env = environ()
    record = runstatus.refresh_one(find_run_dir(run))
    target = attach.find_target(record, node)
    terminal = sys.stdin.isatty() and not as_json
    plan = attach.plan_attach(
        record, target, command, container=container, pty=terminal, environ=env
    )
    if terminal:
        attach.become(plan)
    code, out, err = attach.call(plan, capture=as_json)
    if as_json:
        shown = {
            "run_id": target.run_id,
            "job_id": target.job_id,
            "node": target.node,
            "nodes": list(target.nodes),
            "container": container,
            "command": list(command),
            "exit_code": code,
            "stdout": out,
            "stderr": err,
        }
        click.echo(json.dumps(shown))
    return code
