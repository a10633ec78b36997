"""Which `hpclaunch.toml` a command takes settings from, and whether it may.

On a shared machine anyone can leave a file in /tmp or in a group-writable project
folder, and a project file runs setup lines as the user and may name an SSH host. So:
- The search goes from the working folder up to the git work tree's root, never above
  $HOME; outside a git work tree only the working folder is read (a project file in a
  parent folder is then named in a warning, not read). HPCLAUNCH_CONFIG names one directly.
- The file is read only when it is the user's (or root's) and writable by nobody else,
  unless the user's own config lists it in safe_project_files (a team's shared file).
  Otherwise it is ignored with one warning line naming it and the fix.
- A `[clusters.NAME.remote] host` from it is kept only when the user's own settings name
  the same host (config.toml's remote_hosts, or the user's profile of NAME).
Warnings are lines without the `hpclaunch: warning: ` prefix. On the CLI, choose.py says
them before the command runs (`tell`); the run's own warnings then leave them out
(`untold`), so each is said once per command. Light: read before click is imported.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, Optional

from hpclaunch.config import userconfig
from hpclaunch.config.tomlfiles import loads
from hpclaunch.errors import UserError, show

PROJECT_FILE = "hpclaunch.toml"
_TOLD: set[str] = set()  # warnings already said by this process (the CLI's)


class Found(NamedTuple):
    path: Optional[Path]  # the file used; None: none
    data: dict[str, Any]  # its tables, [remote] hosts it may not name taken out
    warnings: tuple[str, ...] = ()


def search_folders(cwd: Path, environ: Mapping[str, str]) -> tuple[list[Path], list[Path]]:
    """(folders whose project file is read, nearest first; parent folders outside a git
    work tree, whose project file is only named in a warning)."""
    home = _home(environ)
    chain: list[Path] = []
    for folder in (cwd, *cwd.parents):
        chain.append(folder)
        if (folder / ".git").exists():
            if home in chain:  # a work tree above $HOME: $HOME is the ceiling
                chain = chain[: chain.index(home) + 1]
            return chain, []
    # Outside git: the working folder only; parents up to $HOME are looked at for a note.
    parents = chain[1 : chain.index(home) + 1] if home in chain else chain[1:]
    return [cwd], parents


def _home(environ: Mapping[str, str]) -> Optional[Path]:
    home = environ.get("HOME") or os.path.expanduser("~")
    return Path(os.path.realpath(home)) if home and home != "~" else None


def find(cwd: Path, environ: Mapping[str, str]) -> Found:
    """The project file this command uses, its tables, and the warnings to say."""
    config = userconfig.load(environ)
    warnings = list(config.warnings)
    explicit = environ.get("HPCLAUNCH_CONFIG")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise UserError(
                "HPCLAUNCH_CONFIG", f"{show(explicit)} is not a file", "", "Fix or unset it"
            )
        candidates = [path]
    else:
        folders, parents = search_folders(cwd, environ)
        candidates = [folder / PROJECT_FILE for folder in folders]
        for folder in parents:
            if os.path.lexists(folder / PROJECT_FILE):
                warnings.append(
                    f"not reading {folder / PROJECT_FILE}: outside a git work tree only the "
                    f"working folder's {PROJECT_FILE} is read. Fix: run from that folder, or "
                    "name the file in HPCLAUNCH_CONFIG"
                )
                break
    for candidate in candidates:
        if not os.path.lexists(candidate):
            continue
        raw, why = _read_trusted(candidate, config)
        if raw is None:
            listing = f"add it to safe_project_files in {config.path}"
            own = why.startswith("writable")  # the user's (or root's) file, too open
            fix = f"chmod go-w {candidate}, or if others must edit it, {listing}"
            warnings.append(
                f"ignoring {candidate}: {why}; a project file is read only when it is yours "
                f"and writable by you alone. Fix: {fix if own else 'if you trust it, ' + listing}"
            )
            continue  # one not to trust hides nothing above it either: read on
        data = _parse(raw, candidate)
        data, host_warnings = _trusted_hosts(data, candidate, config, environ)
        return Found(candidate, data, tuple(warnings + host_warnings))
    return Found(None, {}, tuple(warnings))


def _read_trusted(path: Path, config: userconfig.UserConfig) -> tuple[Optional[bytes], str]:
    """The file's bytes when it may be read, else (None, why). A folder, a broken link or
    a special file of the user's own is an error to fix, as before."""
    listed = _is_listed(path, config.safe_project_files)
    raw, why = userconfig.read_owned(path)
    if raw is not None:
        return raw, ""
    if why is not None and listed and path.is_file():
        return path.read_bytes(), ""  # the user vouched for it: ownership not asked
    mine = _lstat_owner(path) in (os.geteuid(), 0)
    if mine and (why is None or why.startswith(("not a regular file", "cannot be opened"))):
        raise UserError(
            str(path),
            "not a readable file (a folder, a broken link or a special file)",
            "",
            f"Remove or rename it, or write the project's settings into a {PROJECT_FILE}",
        )
    return None, why or "not a regular file"


def _lstat_owner(path: Path) -> int:
    try:
        return path.lstat().st_uid
    except OSError:
        return -1


def _is_listed(path: Path, safe: Iterable[Path]) -> bool:
    real = os.path.realpath(path)
    return any(os.path.realpath(item) == real or item == path.absolute() for item in safe)


def _parse(raw: bytes, path: Path) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            PROJECT_FILE,
            f"{path} is not UTF-8 text (byte {exc.start})",
            "TOML files are UTF-8",
            "Save it as UTF-8 or remove the file",
        ) from None
    return loads(text, path, PROJECT_FILE)


def _trusted_hosts(
    data: dict[str, Any], path: Path, config: userconfig.UserConfig, environ: Mapping[str, str]
) -> tuple[dict[str, Any], list[str]]:
    """data without the [clusters.NAME.remote] hosts the user's own settings do not name:
    a project file could otherwise send a plain command, and its secrets, to any host."""
    clusters = data.get("clusters")
    if not isinstance(clusters, dict):
        return data, []
    warnings: list[str] = []
    kept: dict[str, Any] = {}
    for name, table in clusters.items():
        remote = table.get("remote") if isinstance(table, dict) else None
        host = remote.get("host") if isinstance(remote, dict) else None
        if not isinstance(remote, dict) or host is None:
            kept[name] = table
            continue
        if host in config.remote_hosts or host == _user_host(name, environ):
            kept[name] = table
            continue
        kept[name] = {**table, "remote": {k: v for k, v in remote.items() if k != "host"}}
        warnings.append(
            f"ignoring [clusters.{name}.remote] host = {show(host)} in {path}: a project file "
            "may name an SSH host only when your own settings do. Fix: if you trust it, add "
            f"remote_hosts = [{_toml_text(host)}] to {config.path}"
        )
    return {**data, "clusters": kept}, warnings


def _toml_text(value: object) -> str:
    text = str(value)
    plain = text.isprintable() and '"' not in text and "\\" not in text
    return f'"{text}"' if plain else show(value)


def _user_host(name: str, environ: Mapping[str, str]) -> Optional[str]:
    """The [remote] host of the user's own profile of cluster `name`, if any."""
    path = userconfig.config_dir(environ) / "clusters" / f"{name}.toml"
    if not path.is_file() or "/" in name:
        return None
    try:
        remote = loads(path.read_text("utf-8"), path, "cluster profile").get("remote", {})
    except (OSError, UnicodeDecodeError, UserError):
        return None  # the profile's own load says what is wrong with it
    host = remote.get("host") if isinstance(remote, dict) else None
    return host if isinstance(host, str) else None


def tell(lines: Iterable[str]) -> None:
    """Say warnings on stderr now (the CLI, before a command runs), once each."""
    for line in lines:
        if line not in _TOLD:
            _TOLD.add(line)
            print(f"hpclaunch: warning: {line}", file=sys.stderr)


def untold(lines: Iterable[str]) -> list[str]:
    """The warnings this process has not said yet (a library caller's: all of them)."""
    return [line for line in lines if line not in _TOLD]


def used_line(path: Optional[Path]) -> list[str]:
    """What run, sweep and --dry-run say about the project file they use (nothing when
    they use none)."""
    return [] if path is None else [f"hpclaunch: project file: {path}"]
