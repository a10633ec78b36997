"""`hpclaunch remote setup|check HOST`: install this hpclaunch on a cluster's login node
over SSH, and say what works there."""

from __future__ import annotations

import json
import sys

import click

PYTHON_HELP = (
    "The cluster's Python >= 3.9 to build the venv with (default: python3 on the login "
    "node's PATH; LUMI's system one is older: give a module's, e.g. /appl/.../bin/python3)."
)


@click.group("remote")
def remote_group() -> None:
    """Work on a cluster from this machine: every command takes --remote HOST (an
    OpenSSH destination: a ~/.ssh/config alias, user@host, host:port), or a profile's
    `[remote] host`. See docs/remote.md."""


@remote_group.command("setup")
@click.argument("host")
@click.option("--python", default="python3", metavar="PATH", help=PYTHON_HELP)
@click.option(
    "--with",
    "extras",
    multiple=True,
    metavar="EXTRA",
    help="Also install an optional extra there (repeatable): stack (py-spy), plot "
    "(matplotlib), optuna, yaml.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object when installed; progress on stderr."
)
def setup_cmd(host: str, python: str, extras: tuple[str, ...], as_json: bool) -> int:
    """Install this hpclaunch on HOST into ~/.hpclaunch/venv, from wheels built and
    shipped from here (the login node needs no package index). Checks first: Python,
    Slurm's commands and controller, rsync; a refusal leaves nothing behind. Run it
    again after upgrading hpclaunch here: later commands refuse a cluster whose
    hpclaunch differs from this one, file for file."""
    from hpclaunch.cli.common import environ
    from hpclaunch.remote.setup import setup

    wanted = [name for item in extras for name in item.split(",") if name]
    if not as_json:
        return setup(host, python, environ(), wanted)
    code = setup(host, python, environ(), wanted, out=sys.stderr)
    click.echo(json.dumps({"host": host, "installed": code == 0, "extras": wanted}))
    return code


@remote_group.command("check")
@click.argument("host")
@click.option("--python", default="python3", metavar="PATH", help=PYTHON_HELP)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: every check's verdict.")
def check_cmd(host: str, python: str, as_json: bool) -> int:
    """One table of what works on HOST: connection, multiplexing, Python, Slurm, rsync,
    hpclaunch (the same build as here?), a writable ~/.hpclaunch. Exit 1 on a FAIL."""
    from hpclaunch.cli.common import environ
    from hpclaunch.remote.setup import check_rows

    rows = check_rows(host, python, environ())
    failed = any(verdict == "FAIL" for _, verdict, _ in rows)
    if as_json:
        checks = [{"check": what, "verdict": verdict, "detail": detail}
                  for what, verdict, detail in rows]  # fmt: skip
        click.echo(json.dumps({"host": host, "ok": not failed, "checks": checks}))
        return 1 if failed else 0
    width = max(len(what) for what, _, _ in rows)
    for what, verdict, detail in rows:
        click.echo(f"{what:<{width}}  {verdict:<4}  {detail}")
    return 1 if any(verdict == "FAIL" for _, verdict, _ in rows) else 0
