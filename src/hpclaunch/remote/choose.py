"""Does this command run here or on a cluster's login node over SSH?

`--remote HOST` (anywhere before the program's `--`) always goes remote. Otherwise the
profile the command names (`--cluster`, HPCLAUNCH_CLUSTER, the project file's
`cluster`) may say `[remote] host`; that is ignored on the login node itself: where the
hostname matches the host or the profile's login_hostnames, or where sbatch is on PATH.
A project file's host counts only when the user's own settings name it (projectfile.py).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Optional

from hpclaunch.errors import UserError

OPTION = "--remote"
LOCAL_ONLY = ("remote",)  # `hpclaunch remote ...` manages remotes: never forwarded


class Choice(NamedTuple):  # a NamedTuple: dataclasses costs this fast path 8 ms of imports
    host: str
    argv: tuple[str, ...]  # the command line without --remote
    source: str  # "--remote" or "profile NAME"


def _split(argv: Sequence[str]) -> tuple[Optional[str], list[str]]:
    """--remote's value and the argv without it; only words before `--` count."""
    out: list[str] = []
    host: Optional[str] = None
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            out += words[i:]
            break
        if word == OPTION:
            if i + 1 >= len(words) or words[i + 1].startswith("-"):
                raise UserError(OPTION, "needs a host", "", "Example: --remote lumi")
            host, i = words[i + 1], i + 2
            continue
        if word.startswith(OPTION + "="):
            host = word.partition("=")[2]
        else:
            out.append(word)
        i += 1
    return host, out


def _named_cluster(
    argv: Sequence[str], project_run: Mapping[str, Any], environ: Mapping[str, str]
) -> Optional[str]:
    words = list(argv[: argv.index("--")] if "--" in argv else argv)
    for i, word in enumerate(words):
        if word == "--cluster" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--cluster="):
            return word.partition("=")[2]
    from hpclaunch.config.layering import named_cluster

    found = named_cluster(project_run, environ)
    return found[0] if found else None


def on_login_node(host: str, patterns: Sequence[str], environ: Mapping[str, str]) -> bool:
    import socket  # only with a [remote] host

    here = socket.gethostname()
    short = here.split(".")[0]
    target = host.rpartition("@")[2].split(":")[0]
    if here in (target, target.split(".")[0]) or short == target.split(".")[0]:
        return True
    if any(fnmatch.fnmatch(here, p) or fnmatch.fnmatch(short, p) for p in patterns):
        return True
    import shutil

    return shutil.which("sbatch", path=environ.get("PATH", "")) is not None


def choose(argv: Sequence[str], cwd: Path, environ: Mapping[str, str]) -> Optional[Choice]:
    """Where the command runs: a Choice to forward it, None to run it here."""
    if not argv or argv[0] in LOCAL_ONLY:
        return None
    host, rest = _split(argv)
    if host is not None:
        return Choice(host, tuple(rest), OPTION)
    if argv[0] in ("-h", "--help", "--version"):
        return None
    from hpclaunch.config import projectfile
    from hpclaunch.config.layering import tables_of

    # Read here for every command: a project file that is ignored, or a [remote] host it
    # may not name, is said now, whether or not the command reads the file again.
    found = projectfile.find(cwd, environ)
    projectfile.tell(found.warnings)
    project_run, clusters = tables_of(found)
    name = _named_cluster(rest, project_run, environ)
    if not name:
        return None
    from hpclaunch.config.profiles import load_profile, user_profile_dir

    if name not in clusters and not (user_profile_dir(environ) / f"{name}.toml").is_file():
        return None  # a built-in profile: none names a remote (no load on the fast path)
    profile = load_profile(name, clusters, environ)
    remote = profile.remote
    if not remote.host or on_login_node(remote.host, remote.login_hostnames, environ):
        return None
    return Choice(remote.host, tuple(rest), f"profile {name}")
