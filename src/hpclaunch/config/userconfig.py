"""The user's own settings: `$XDG_CONFIG_HOME/hpclaunch/config.toml` (else
`~/.config/hpclaunch/config.toml`), and the ownership rule every file hpclaunch takes
settings from must pass on a shared machine.

The file is read only when it is the user's (or root's) and writable by nobody else; a
file that fails is ignored with one warning line (as git ignores a repository another
user owns). Its keys are listed once, in KEYS; each becomes a typed field of UserConfig.
To add a key: a Key in KEYS, a field of the same name (with its default) in UserConfig,
and a line in docs/config.md. Read on the path that decides where a command runs, before
click: standard library and hpclaunch's own light modules only.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Optional

from hpclaunch.config.tomlfiles import loads
from hpclaunch.errors import UserError, show

CONFIG_NAME = "config.toml"


class Key(NamedTuple):
    name: str
    kind: str  # "paths": absolute paths (~ allowed); "strings": a list of text
    help: str


KEYS = (
    Key(
        "safe_project_files",
        "paths",
        "project files (hpclaunch.toml) read although another user owns them or a group "
        "may write them: a team's shared file",
    ),
    Key(
        "remote_hosts",
        "strings",
        "SSH hosts a project file's [clusters.NAME.remote] host may name",
    ),
    Key(
        "secret_names",
        "strings",
        "more variable names to treat as secrets (travel only in the environment, masked "
        "in records), besides those with a segment such as TOKEN, KEY or PASS",
    ),
    Key(
        "forward_env",
        "strings",
        "variables that cross to the cluster on every --remote command (a secret crosses "
        "only when the command uses it: --env NAME, --forward-env NAME, or this list)",
    ),
)


class UserConfig(NamedTuple):  # a NamedTuple: choose.py's fast path avoids dataclasses
    path: Path  # where the file is (or would be)
    safe_project_files: tuple[Path, ...] = ()
    remote_hosts: tuple[str, ...] = ()
    secret_names: tuple[str, ...] = ()
    forward_env: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # the file ignored, and why (one line each)


def config_dir(environ: Mapping[str, str]) -> Path:
    """`$XDG_CONFIG_HOME/hpclaunch`, else `~/.config/hpclaunch` (the request's HOME)."""
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    base = environ.get("XDG_CONFIG_HOME") or str(home / ".config")
    return Path(base) / "hpclaunch"


def config_path(environ: Mapping[str, str]) -> Path:
    return config_dir(environ) / CONFIG_NAME


def foreign_reason(info: os.stat_result) -> Optional[str]:
    """Why a file with this stat may not give settings, or None: it must belong to this
    user or root (root can change anything anyway) and be writable by nobody else."""
    if info.st_uid not in (os.geteuid(), 0):
        return f"owned by {owner_name(info.st_uid)}, not you"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "group and others" if info.st_mode & stat.S_IWOTH else "its group"
        return f"writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def owner_name(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def read_owned(path: Path) -> tuple[Optional[bytes], Optional[str]]:
    """(the bytes, None) when path is a regular file that passes foreign_reason, checked
    on the open file so that what is read is what was checked; (None, why) when not;
    (None, None) when there is no file. A symlink must itself be the user's or root's."""
    try:
        link = path.lstat()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot be examined: {exc.strerror}"
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (os.geteuid(), 0):
        return None, f"a symbolic link owned by {owner_name(link.st_uid)}, not you"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # NONBLOCK: a planted FIFO
    except OSError as exc:
        return None, f"cannot be opened: {exc.strerror}"
    try:
        info = os.fstat(fd)
        why = foreign_reason(info)
        if why:
            return None, why
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks), None
            chunks.append(chunk)
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror}"
    finally:
        os.close(fd)


def load(environ: Mapping[str, str]) -> UserConfig:
    """The user's config; its defaults when there is none or it is ignored. A damaged
    file of the user's own is a UserError (the user can fix it); a foreign one a warning."""
    return load_path(config_path(environ))


def load_path(path: Path) -> UserConfig:
    """:func:`load` of the file at `path`."""
    raw, why = read_owned(path)
    if why:
        fix = (
            f"chmod go-w {path}"
            if why.startswith("writable")
            else f"remove {path} and write your own"
        )
        return UserConfig(path, warnings=(f"ignoring {path}: {why}. Fix: {fix}",))
    if raw is None:
        return UserConfig(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            str(path), f"not UTF-8 text (byte {exc.start})", "TOML files are UTF-8", "Fix it"
        ) from None
    data = loads(text, path, str(path))
    known = {key.name: key for key in KEYS}
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name not in known:
            raise UserError(
                f"{path} {name}",
                "unknown key",
                f"known: {', '.join(known)}",
                "Remove or rename it (see docs/config.md)",
            )
        values[name] = _typed(known[name], value, path)
    return UserConfig(path, **values)


def _typed(key: Key, value: Any, path: Path) -> tuple[Any, ...]:
    field = f"{path} {key.name}"
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise UserError(field, f"{show(value)} is not a list of strings", "", 'Use ["..."]')
    if key.kind == "strings":
        return tuple(value)
    paths = tuple(Path(os.path.expanduser(item)) for item in value)
    for item in paths:
        if not item.is_absolute():
            raise UserError(field, f"{show(str(item))} is not an absolute path", "", "Use /...")
    return paths
