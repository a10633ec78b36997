"""The laptop's side: one hpclaunch command run by the cluster's own hpclaunch over SSH.

Everything that needs the cluster's file system (binds, images, venvs, run folders, the
index) happens there, exactly as on the login node; the laptop adds only what it alone
has: the code (mirrored with rsync before a submission), the secrets the command uses
(sent on standard input: those --env names, a W&B sweep's key, --forward-env, the
config's and profile's forward_env; no other secret of the laptop), and, for `plot`,
the files it asked for (fetched back).
Output streams straight through, and the command's exit code is the remote one.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from hpclaunch.basics.shell import check_name
from hpclaunch.config.secretnames import is_secret
from hpclaunch.errors import UserError
from hpclaunch.remote.build_id import fingerprint
from hpclaunch.remote.ssh import Connection, Host

if TYPE_CHECKING:  # ship.py is imported only for a submission (its imports cost)
    from hpclaunch.config.profiles import RemoteSettings
    from hpclaunch.remote.ship import Shipped

VENV = ".hpclaunch/venv"  # relative to the remote home
# -c, not -m: runpy's imports are a few ms on every command.
SERVE = (f"{VENV}/bin/python", "-I", "-c", "from hpclaunch.cli.serve import main; main()")
NOT_SET_UP = 127  # the remote shell's "command not found"
SUBMITTING = ("run",)
SWEEP_SUBCOMMANDS = ("status", "wait", "retry", "cancel", "throttle", "plot", "wandb-template")
TMP = ".hpclaunch/tmp"


class LaptopOptions(NamedTuple):
    """Options only the laptop reads (taken out of the words before they cross)."""

    ship: Optional[str] = None  # --ship DIR: the folder to ship outside a git work tree
    forward_env: tuple[str, ...] = ()  # --forward-env NAME: more variables that cross


LAPTOP_OPTIONS = {"--ship": "ship", "--forward-env": "forward_env"}


def split_laptop_options(argv: Sequence[str]) -> tuple[list[str], LaptopOptions]:
    """--ship and --forward-env (before the program's `--`) and the words without them."""
    out: list[str] = []
    found: dict[str, list[str]] = {"ship": [], "forward_env": []}
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            out += words[i:]
            break
        name, eq, value = word.partition("=")
        if name in LAPTOP_OPTIONS:
            if not eq:
                if i + 1 >= len(words) or words[i + 1].startswith("-"):
                    raise UserError(name, "needs a value", "", f"Example: {name} {_EXAMPLE[name]}")
                value, i = words[i + 1], i + 1
            found[LAPTOP_OPTIONS[name]].append(value)
        else:
            out.append(word)
        i += 1
    for value in found["forward_env"]:
        check_name(value, "--forward-env")
    ship = found["ship"][-1] if found["ship"] else None
    return out, LaptopOptions(ship, tuple(found["forward_env"]))


_EXAMPLE = {"--ship": ".", "--forward-env": "HF_TOKEN"}


def config_forward_env(environ: Mapping[str, str]) -> tuple[str, ...]:
    """`forward_env = [...]` in the user's own config file (userconfig.py: read only
    when it is theirs): names that cross on every command."""
    from hpclaunch.config.userconfig import load

    return tuple(check_name(n, "forward_env") for n in load(environ).forward_env)


def used_names(argv: Sequence[str], extra: Iterable[str] = ()) -> set[str]:
    """The variables a command uses, by name: --env's (NAME or NAME=VALUE), the W&B
    key of a W&B sweep, and `extra` (--forward-env, the config's and profile's lists)."""
    words = argv[: list(argv).index("--")] if "--" in argv else list(argv)
    names = set(extra)
    for i, word in enumerate(words):
        if word == "--env" and i + 1 < len(words):
            names.add(words[i + 1].partition("=")[0])
        elif word.startswith("--env="):
            names.add(word[len("--env=") :].partition("=")[0])
    wandb = any(w == "--wandb-sweep" or w.startswith("--wandb-sweep=") for w in words)
    if words and words[0] == "sweep" and wandb:
        names.add("WANDB_API_KEY")
    return names


def sent_environment(environ: Mapping[str, str], names: Iterable[str] = ()) -> dict[str, str]:
    """What crosses from the laptop's environment: the variables named (those the
    command uses), W&B's settings that are no secrets and the cluster profile's name.
    No other secret of the laptop ever crosses."""
    wanted = set(names)
    return {
        k: v
        for k, v in environ.items()
        if k in wanted
        or (not is_secret(k) and (k.startswith("WANDB_") or k == "HPCLAUNCH_CLUSTER"))
    }


def project_mirror(cwd: Path, ship: Optional[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The shipped project a command is for, as the cluster holds it (`last` there is
    its newest run): {HPCLAUNCH_SHIPPED_PROJECT: its mirror} where this folder is in a git
    work tree (or --ship names one); outside git, the folder --ship last shipped from here
    (shipmemory.py: later commands take no --ship); else ANY_PROJECT (`last` is anyone's)."""
    from hpclaunch.records.index import ANY_PROJECT, PROJECT_VARIABLE
    from hpclaunch.remote.ship import PROJECTS, mirror_name, ship_root
    from hpclaunch.remote.shipmemory import recall

    try:
        root, _ = ship_root(cwd, None if ship is None else Path(ship))
    except UserError:
        remembered = recall(cwd, environ)
        if remembered is None:
            return {PROJECT_VARIABLE: ANY_PROJECT}
        root = remembered
    return {PROJECT_VARIABLE: f"~/{PROJECTS}/{mirror_name(root)}"}


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
    if argv[0] in ("rm", "gc"):  # they ask before deleting, on the laptop's terminal
        return not {"--yes", "-y", "--json"} & set(argv)
    return argv[0] in ("attach", "dev") or (argv[0] == "top" and "--once" not in argv)


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


def ship_code(
    conn: Connection,
    cwd: Path,
    program: Sequence[str],
    folder: Optional[str] = None,
    limit_bytes: Optional[int] = None,
) -> Shipped:
    """Before a submission: refuse an ignored path among the program's arguments and a
    cluster with another hpclaunch, then mirror the project (the CLI and the API)."""
    from dataclasses import replace

    from hpclaunch.payload.project import git_root
    from hpclaunch.remote.ship import SHIP_LIMIT, refuse_ignored, ship, ship_root

    root, by_git = ship_root(cwd, None if folder is None else Path(folder))
    refuse_ignored(git_root(root) if by_git else None, cwd, program, conn.host.name)
    refuse_other_build(conn)
    limit = SHIP_LIMIT if limit_bytes is None else limit_bytes
    shipped = ship(conn, cwd, None if folder is None else Path(folder), limit)
    return replace(shipped, removed=prune_there(conn, shipped))


def prune_there(conn: Connection, shipped: Shipped) -> int:
    """The cluster's hpclaunch removes what an earlier ship sent and the laptop no longer
    has (ship.prune); how many files it removed (0 when it could not say)."""
    header = request(conn, [], op="prune", mirror=shipped.mirror, files=list(shipped.listed))
    done = conn.run(list(SERVE), stdin=json.dumps(header).encode() + b"\n", timeout=120)
    said = done.stdout.decode("utf-8", "replace").split()
    return int(said[-1]) if done.returncode == 0 and said and said[-1].isdigit() else 0


def profile_remote(argv: Sequence[str], cwd: Path, environ: Mapping[str, str]) -> RemoteSettings:
    """The [remote] table of the profile the command names (--cluster, HPCLAUNCH_CLUSTER,
    the project file), as the laptop reads it; the defaults when none is named or the
    laptop does not know it (a profile that only the cluster has)."""
    from hpclaunch.config.layering import project_tables
    from hpclaunch.config.profiles import BUILTIN, RemoteSettings, load_profile, user_profile_dir
    from hpclaunch.remote.choose import _named_cluster

    project_run, clusters = project_tables(cwd, environ)
    name = _named_cluster(argv, project_run, environ)
    if not name or not (
        name in BUILTIN
        or name in clusters
        or (user_profile_dir(environ) / f"{name}.toml").is_file()
    ):
        return RemoteSettings()
    return load_profile(name, clusters, environ).remote


def project_names(argv: Sequence[str], cwd: Path, environ: Mapping[str, str]) -> set[str]:
    """What the project file makes a submission use: its [run] env names, and the W&B
    key when [sweep] wandb_sweep makes a sweep a W&B one."""
    from hpclaunch.config.layering import find_project_file
    from hpclaunch.config.tomlfiles import read_toml

    path = find_project_file(cwd, environ)
    data = read_toml(path, "hpclaunch.toml") if path is not None else {}
    run, sweep = data.get("run", {}), data.get("sweep", {})
    env = run.get("env", []) if isinstance(run, dict) else []
    names = {str(item).partition("=")[0] for item in env} if isinstance(env, list) else set()
    if argv and argv[0] == "sweep" and isinstance(sweep, dict) and sweep.get("wandb_sweep"):
        names.add("WANDB_API_KEY")
    return names


def shipping_line(conn: Connection, shipped: Shipped) -> str:
    names = ", ".join(shipped.names[:5]) + (", ..." if len(shipped.names) > 5 else "")
    line = (
        f"hpclaunch: shipped {shipped.files} changed file(s) "
        f"({shipped.bytes_moved} bytes moved) to {conn.host.name}:~/{shipped.remote_cwd}"
        + (f": {names}" if names else "")
    )
    if shipped.removed:
        line += f"; removed there {shipped.removed} file(s) removed here"
    if shipped.withheld:
        line += "; left out (credentials, never shipped): " + ", ".join(shipped.withheld)
    return line


def forward(host: str, argv: Sequence[str], cwd: Path, environ: Mapping[str, str]) -> int:
    """Run `hpclaunch ARGV` on HOST; its exit code."""
    argv, laptop = split_laptop_options(argv)
    if laptop.ship is not None and not submits(argv):
        raise UserError("--ship", "only for run and sweep", "", "Leave --ship out")
    names = used_names(argv, (*laptop.forward_env, *config_forward_env(environ)))
    limit: Optional[int] = None
    if submits(argv) or (argv and argv[0] == "rerun"):
        settings = profile_remote(argv, cwd, environ)
        names.update(settings.forward_env, project_names(argv, cwd, environ))
        if submits(argv):  # refusals before any connection: nothing starts for them
            from hpclaunch.basics.units import parse_size
            from hpclaunch.remote.ship import ship_root

            shipped_root, _ = ship_root(cwd, None if laptop.ship is None else Path(laptop.ship))
            limit = parse_size(settings.ship_limit, "[remote] ship_limit")
    conn = Connection(Host.parse(host), environ).open()
    if wants_terminal(argv):  # no secret crosses this way, but the project's name may
        text = json.dumps(request(conn, argv, env=project_mirror(cwd, laptop.ship, environ)))
        code = conn.stream([*SERVE, base64.b64encode(text.encode()).decode()], tty=True)
        return not_set_up(conn) if code == NOT_SET_UP else code
    sent = {**sent_environment(environ, names), **project_mirror(cwd, laptop.ship, environ)}
    extra: dict[str, Any] = {"env": sent}
    if limit is not None:
        shipped = ship_code(conn, cwd, program_of(argv), laptop.ship, limit)
        print(shipping_line(conn, shipped), file=sys.stderr)
        if laptop.ship is not None:  # later commands from here (no --ship) name it too
            from hpclaunch.remote.shipmemory import remember

            remember(cwd, shipped_root, environ)
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
