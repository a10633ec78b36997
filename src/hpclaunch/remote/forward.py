"""The laptop's side: one hpclaunch command run by the cluster's own hpclaunch over SSH.

Everything that needs the cluster's file system (binds, images, venvs, run folders, the
index) happens there, exactly as on the login node; the laptop adds only what it alone
has: the code (mirrored with rsync before a submission), the secrets in its environment
(sent on standard input), and, for `plot`, the files it asked for (fetched back).
Output streams straight through, and the command's exit code is the remote one.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..errors import UserError
from ..secretnames import is_secret
from .build_id import fingerprint
from .ssh import Connection, Host

if TYPE_CHECKING:  # ship.py is imported only for a submission (its imports cost)
    from .ship import Shipped

VENV = ".hpclaunch/venv"  # relative to the remote home
# -c, not -m: runpy's imports are a few ms on every command.
SERVE = (f"{VENV}/bin/python", "-I", "-c", "from hpclaunch.remote.serve import main; main()")
NOT_SET_UP = 127  # the remote shell's "command not found"
SUBMITTING = ("run",)
SWEEP_SUBCOMMANDS = ("status", "wait", "retry", "cancel", "throttle", "plot", "wandb-template")
TMP = ".hpclaunch/tmp"


def sent_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What crosses from the laptop's environment: secrets (names with KEY, TOKEN,
    SECRET, PASSWORD, CREDENTIAL), W&B's settings and the cluster profile's name."""
    return {
        k: v
        for k, v in environ.items()
        if is_secret(k) or k.startswith("WANDB_") or k == "HPCLAUNCH_CLUSTER"
    }


def submits(argv: Sequence[str]) -> bool:
    """run, or sweep in its submitting form: the laptop's code goes first."""
    if not argv:
        return False
    if argv[0] in SUBMITTING:
        return True
    return argv[0] == "sweep" and (len(argv) == 1 or argv[1] not in SWEEP_SUBCOMMANDS)


def program_of(argv: Sequence[str]) -> list[str]:
    return list(argv[argv.index("--") + 1 :]) if "--" in argv else []


def wants_terminal(argv: Sequence[str]) -> bool:
    if not argv or not sys.stdin.isatty() or not sys.stdout.isatty():
        return False
    return argv[0] == "attach" or (argv[0] == "top" and "--once" not in argv)


def request(conn: Connection, argv: Sequence[str], **extra: Any) -> dict[str, Any]:
    return {"v": 1, "argv": list(argv), "build": fingerprint(), "host": conn.host.name, **extra}


def remote_facts(conn: Connection) -> Optional[dict[str, Any]]:
    """The installed remote hpclaunch's facts (serve.facts); None when none answers."""
    payload = json.dumps(request(conn, [], op="facts")).encode() + b"\n"
    done = conn.run(list(SERVE), stdin=payload, timeout=60)
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        return None
    found: dict[str, Any] = json.loads(lines[-1])
    return found


def _not_set_up(name: str) -> UserError:
    return UserError(
        "--remote",
        f"hpclaunch is not set up on {name} (no ~/{VENV})",
        "",
        f"Run: hpclaunch remote setup {name}",
    )


def refuse_other_build(conn: Connection) -> None:
    """Before shipping anything: the cluster must run this very hpclaunch."""
    facts = remote_facts(conn)
    name, mine = conn.host.name, fingerprint()
    if facts is not None and facts.get("build") == mine:
        return
    conn.close()  # refused: no master left behind for a host that cannot be used
    if facts is None:
        raise _not_set_up(name)
    raise UserError(
        "--remote",
        f"{name} runs another hpclaunch (build {facts.get('build')}; this machine's is {mine})",
        "",
        f"Run: hpclaunch remote setup {name}",
    )


def not_set_up(conn: Connection) -> int:
    """The remote shell found no venv (exit 127): the same line as refuse_other_build's."""
    error = _not_set_up(conn.host.name)
    print(error.line(), file=sys.stderr)
    return error.exit_code


def ship_code(conn: Connection, cwd: Path, program: Sequence[str]) -> Shipped:
    """Before a submission: refuse an ignored path among the program's arguments and a
    cluster with another hpclaunch, then mirror the project (the CLI and the API)."""
    from ..project import git_root
    from .ship import refuse_ignored, ship

    refuse_ignored(git_root(cwd), cwd, program, conn.host.name)
    refuse_other_build(conn)
    return ship(conn, cwd)


def forward(host: str, argv: Sequence[str], cwd: Path, environ: Mapping[str, str]) -> int:
    """Run `hpclaunch ARGV` on HOST; its exit code."""
    conn = Connection(Host.parse(host), environ).open()
    if wants_terminal(argv):
        text = json.dumps(request(conn, argv))
        code = conn.stream([*SERVE, base64.b64encode(text.encode()).decode()], tty=True)
        return not_set_up(conn) if code == NOT_SET_UP else code
    extra: dict[str, Any] = {"env": sent_environment(environ)}
    if submits(argv):
        shipped = ship_code(conn, cwd, program_of(argv))
        names = ", ".join(shipped.names[:5]) + (", ..." if len(shipped.names) > 5 else "")
        print(
            f"hpclaunch: shipped {shipped.files} changed file(s) "
            f"({shipped.bytes_moved} bytes moved) to {conn.host.name}:~/{shipped.remote_cwd}"
            + (f": {names}" if names else ""),
            file=sys.stderr,
        )
        extra["cwd"] = shipped.remote_cwd
    if argv and (argv[0] == "plot" or list(argv[:2]) == ["sweep", "plot"]):
        return _plot(conn, argv, cwd, extra)
    payload = json.dumps(request(conn, argv, **extra)).encode() + b"\n"
    code = conn.stream(SERVE, stdin=payload)
    return not_set_up(conn) if code == NOT_SET_UP else code


def _rewrite_outputs(argv: Sequence[str], tmp: str) -> tuple[list[str], dict[str, str]]:
    """-o/--output/--data FILE become files in a remote scratch folder; returns the new
    argv and remote path -> laptop path."""
    out: list[str] = []
    fetch: dict[str, str] = {}
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, value = word.partition("=")
        if name in ("-o", "--output", "--data") and (eq or i + 1 < len(words)):
            if not eq:
                value, i = words[i + 1], i + 1
            remote = f"{tmp}/{len(fetch)}-{Path(value).name}"
            fetch[remote] = value
            out += [name, remote]
        else:
            out.append(word)
        i += 1
    return out, fetch


def _plot(conn: Connection, argv: Sequence[str], cwd: Path, extra: dict[str, Any]) -> int:
    """A plot made on the cluster; the PNG (and --data CSV) come back to the laptop."""
    import uuid

    tmp = f"{TMP}/{uuid.uuid4().hex[:12]}"
    new_argv, fetch = _rewrite_outputs(argv, tmp)
    payload = json.dumps(request(conn, [*new_argv], **extra)).encode() + b"\n"
    done = conn.run(
        ["sh", "-c", 'mkdir -p "$1" && shift && exec "$@"', "sh", tmp, *SERVE], stdin=payload
    )
    sys.stderr.write(done.stderr.decode("utf-8", "replace"))
    if done.returncode == NOT_SET_UP:
        return not_set_up(conn)
    try:
        for remote, wanted in fetch.items():
            (cwd / wanted).parent.mkdir(parents=True, exist_ok=True)
            conn.rsync(["-a", f":{remote}", str(cwd / wanted)])  # missing: the remote said why
        for line in done.stdout.decode("utf-8", "replace").splitlines():
            print(_brought_back(conn, line, fetch, cwd))
    finally:
        conn.run(["rm", "-rf", "--", tmp])
    return done.returncode


def _brought_back(conn: Connection, line: str, fetch: dict[str, str], cwd: Path) -> str:
    """A line naming a file the remote wrote, as its path here (a PNG left in the run
    folder by default is copied to the current folder); other lines as they are."""
    for remote, wanted in fetch.items():
        if line.strip().endswith(remote):
            return str(cwd / wanted)
    path = line.strip()
    if path.startswith("/") and path.endswith((".png", ".csv")):
        local = cwd / Path(path).name
        if conn.rsync(["-a", f":{path}", str(local)]).returncode == 0:
            return str(local)
    return line
