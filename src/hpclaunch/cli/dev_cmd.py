"""`hpclaunch dev`: an interactive session in an allocation of its own (every run
option) or in a running run's (--run)."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import click

from hpclaunch.cli.run_cmd import with_options_named
from hpclaunch.config.options import OPTIONS

DEV_HELP = """Open an interactive session on a compute node, inside the run's allocation,
container, venv and environment: a shell (default), a Jupyter server or an SSH
server for VS Code (docs/interactive.md).

\b
Without --run, hpclaunch gets an allocation with the run options given (time limit:
--time, else the profile's dev_time, 2 h), waits for it, opens the session on its first
node and releases the allocation when the session ends. With --run RUN it joins that
running run's allocation and leaves the run alone.

\b
--jupyter starts jupyter_server from the run's venv or image on the node's loopback with
a random token, relays a port of this machine's loopback to it through the allocation
and prints the URL. Ctrl-C, `hpclaunch cancel` or the time limit end the session.

\b
Examples:
  hpclaunch dev --gpus-per-node 1                       # a shell on a GPU node
  hpclaunch dev --container pytorch.sif -t 1:00:00      # a shell inside the image
  hpclaunch dev --jupyter --venv ~/venvs/torch          # Jupyter, its URL printed
  hpclaunch dev --vscode --container pytorch.sif        # then: ssh hpclaunch-RUN
  hpclaunch dev --run last -- nvidia-smi                # one command in a running run
"""


@click.command("dev", help=DEV_HELP, context_settings={"allow_interspersed_args": False})
@with_options_named(*(opt.name for opt in OPTIONS))
@click.option("--shell", "mode", flag_value="shell", default=True, help="A shell (default).")
@click.option(
    "--jupyter",
    "mode",
    flag_value="jupyter",
    help="A Jupyter server (jupyter_server from the run's environment), its URL printed.",
)
@click.option(
    "--vscode",
    "mode",
    flag_value="vscode",
    help="An OpenSSH server for VS Code's Remote-SSH (in the image when it has sshd), "
    "reached as host hpclaunch-RUN (an entry in ~/.ssh/config while the session lasts).",
)
@click.option(
    "--port",
    "local_port",
    type=click.IntRange(0, 65535),
    default=0,
    help="With --jupyter: this machine's loopback port for the URL (default: a free one).",
)
@click.option(
    "--run",
    "join",
    default=None,
    metavar="RUN",
    help="Join this running run's allocation instead of getting one.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="With --jupyter or --vscode: a JSON line when the session is ready (run_id, "
    "job_id, node, url or host) and one when it ends (run_id, ended); docs/json.md.",
)
@click.option("--frames", is_flag=True, hidden=True, help="A laptop's session (sessions/bridge).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND [ARGS]...]")
def dev_cmd(
    mode: str,
    local_port: int,
    join: Optional[str],
    as_json: bool,
    frames: bool,
    command: tuple[str, ...],
    **options: Any,
) -> int:
    from pathlib import Path

    from hpclaunch.cli.common import environ, find_run_dir
    from hpclaunch.errors import UserError
    from hpclaunch.sessions import session, shell

    if mode != "shell" and command:
        raise UserError(f"--{mode}", "given with a COMMAND", "", "Leave out -- COMMAND")
    if as_json and mode == "shell":
        raise UserError(
            "--json", "given with a shell", "a shell has no result", "Add --jupyter or --vscode"
        )
    env = environ()
    joined = find_run_dir(join) if join is not None else None

    def say(line: str) -> None:
        click.echo(line, err=True)

    link = None
    if frames:  # the login node's side of a laptop's session: stdout carries frames
        from hpclaunch.sessions import allocation
        from hpclaunch.sessions.bridge import LaptopLink

        timeout = allocation.heartbeat_timeout(options, Path.cwd(), env)
        link = LaptopLink(timeout)
        say = link.say
    with session.allocated(options, joined, Path.cwd(), env, sys.argv, say) as record:
        if mode in ("jupyter", "vscode"):
            serve = session.with_jupyter if mode == "jupyter" else session.with_vscode
            shown = {"run_id": record.run_id, "job_id": record.job_id}
            why = serve(
                record,
                env,
                say,
                local_port=local_port,
                on_ready=link.ready if link else (_printer(shown) if as_json else None),
                still_up=link.still_up if link else lambda: None,
                for_laptop=link is not None,
            )
            say(f"hpclaunch: session ended: {why}")
            if as_json:
                click.echo(json.dumps({"run_id": record.run_id, "ended": why}))
            return 0
        return shell.run_shell(record, command, env, sys.stdin.isatty() and not command)


def _printer(shown: dict[str, Any]) -> Any:
    """--json: the ready line on stdout (the session still says its lines on stderr)."""

    def ready(port: int, facts: dict[str, Any]) -> None:
        line = dict(shown)
        if "ready" in facts:
            line["url"] = f"http://127.0.0.1:{port}{facts['ready']}"
        if "ssh" in facts:
            line["host"] = facts["ssh"]["name"]
        click.echo(json.dumps(line), nl=True)

    return ready
