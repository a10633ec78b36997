"""The cluster's side of a laptop's command: `python -I -c "from hpclaunch.cli.serve
import main; main()"` in ~/.hpclaunch/venv.

The laptop's ssh runs exactly this fixed command line; the request comes as one JSON
line on standard input (argv, working folder, environment, the laptop's build id), so no
user text and no secret is ever on a remote command line. A request for a terminal
(attach, a live top) comes base64-encoded as the one argument instead, without secrets:
standard input is then the user's keyboard.

A laptop whose hpclaunch differs from this one, file for file, is refused in one line
before anything runs: the two would disagree on records, options and the rank contract.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

from hpclaunch.remote.build_id import fingerprint

VERSION = 1


def read_request(args: list[str]) -> dict[str, Any]:
    if args:
        raw = base64.b64decode(args[0]).decode("utf-8")
    else:
        raw = sys.stdin.buffer.readline().decode("utf-8")
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("v") != VERSION:
        raise ValueError("not an hpclaunch request")
    return data


def facts() -> dict[str, Any]:
    """What `remote check` and `remote setup` report about this side."""
    import platform
    import shutil

    from hpclaunch.version import __version__

    tools = ("sbatch", "srun", "squeue", "sacct", "scontrol", "rsync")
    return {
        "build": fingerprint(),
        "version": __version__,
        "python": platform.python_version(),
        "executable": sys.executable,
        "home": os.path.expanduser("~"),
        "tools": {name: shutil.which(name) for name in tools},
    }


def main() -> None:
    try:
        req = read_request(sys.argv[1:])
    except (ValueError, UnicodeDecodeError) as exc:
        print(f"hpclaunch: error: remote request: unreadable ({exc})", file=sys.stderr)
        sys.exit(2)
    if req.get("op") == "facts":
        print(json.dumps(facts()))
        return
    mine = fingerprint()
    if req.get("build") != mine:
        host = req.get("host", "the cluster")
        print(
            f"hpclaunch: error: --remote: {host} runs another hpclaunch (build {mine}; "
            f"this machine's is {req.get('build')}). Run: hpclaunch remote setup {host}",
            file=sys.stderr,
        )
        sys.exit(2)
    if req.get("op") == "prune":  # after a ship: what the laptop removed goes here too
        from pathlib import Path

        from hpclaunch.remote.ship import PROJECTS, prune

        name = str(req["mirror"]).removeprefix(PROJECTS + "/")
        if not name or name.startswith(".") or "/" in name:
            sys.exit(2)  # not a mirror's name: nothing to prune
        mirror = Path(os.path.expanduser("~")) / PROJECTS / name
        print(prune(mirror, [str(rel) for rel in req.get("files", [])]))
        return
    from hpclaunch.basics.environ import apply_environment

    apply_environment({str(k): str(v) for k, v in req.get("env", {}).items()})
    if req.get("cwd"):
        os.chdir(os.path.expanduser("~"))
        os.chdir(req["cwd"])
    argv = [str(a) for a in req["argv"]]
    sys.argv = ["hpclaunch", *argv]  # what records keep as the command line (masked)
    from hpclaunch.cli.main import main as cli_main

    cli_main(argv)


if __name__ == "__main__":
    main()
