"""Which environment variable names are secrets, and where their values are hidden.

A name is a secret when one of its `_`-separated segments is a secret word (TOKEN, KEY,
SECRET, PASSWORD, PASSWD, PASS, AUTH, PAT, DSN, COOKIE, PRIVATE, CREDENTIAL(S)), in any
case: GITHUB_PAT, DB_PASS and HF_TOKEN are secrets, PATH, PYTHONPATH, LD_LIBRARY_PATH
and KEYBOARD_LAYOUT are not. A user adds whole names in their own config file
(`secret_names = ["MY_LICENCE"]` in $XDG_CONFIG_HOME/hpclaunch/config.toml, read by
`extra_names`). A secret's value never reaches a file or a command line: only the
environment of sbatch and of the ranks (spec.json masks it, a laptop sends it on SSH's
standard input, a record shows `$NAME` where it appeared in an argument).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from hpclaunch.basics.environ import environment

WORDS = frozenset(
    {"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASS", "AUTH", "PAT", "DSN", "COOKIE"}
    | {"PRIVATE", "CREDENTIAL", "CREDENTIALS"}
)
MIN_MASKED = 8  # shorter values ("1", "true", "main") would mask innocent text
_SEGMENTS = re.compile(r"[^_]+")


def is_secret(name: str, extra: Optional[Iterable[str]] = None) -> bool:
    """Names that look secret never reach a file or a command line, only the environment.
    `extra`: more whole names (default: the user's config file's `secret_names`)."""
    if any(part.upper() in WORDS for part in _SEGMENTS.findall(name)):
        return True
    names = extra_names() if extra is None else frozenset(n.upper() for n in extra)
    return name.upper() in names


def extra_names(environ: Optional[Mapping[str, str]] = None) -> frozenset[str]:
    """The names a user declared secret: `secret_names` in their own config file
    (userconfig.py: read only when it is theirs), upper-cased. A missing, foreign or
    damaged file adds nothing here (the config loader reports it where it is read)."""
    from hpclaunch.config.userconfig import config_path

    return _read_names(str(config_path(environment() if environ is None else environ)))


@lru_cache(maxsize=4)
def _read_names(path: str) -> frozenset[str]:
    # Imported here: a command forwarded over SSH imports this module, rarely a config.
    from hpclaunch.config.userconfig import load_path
    from hpclaunch.errors import UserError

    try:
        names = load_path(Path(path)).secret_names
    except UserError:
        return frozenset()
    return frozenset(name.upper() for name in names)


def secret_values(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(name, value) of the secrets worth masking elsewhere: long enough to be one."""
    return [(k, v) for k, v in pairs if is_secret(k) and len(v) >= MIN_MASKED]


def mask_text(text: str, secrets: Iterable[tuple[str, str]], mark: str = "${}") -> str:
    """`text` with every secret value replaced by `mark` formatted with its name ($NAME
    by default), longest values first so that one holding another is masked whole."""
    for name, value in sorted(secrets, key=lambda kv: -len(kv[1])):
        if value and value in text:
            text = text.replace(value, mark.format(name))
    return text


def masked(data: Any, secrets: Sequence[tuple[str, str]]) -> Any:
    """JSON-like `data` with secret values replaced by $NAME in every string."""
    if not secrets:
        return data
    if isinstance(data, str):
        return mask_text(data, secrets)
    if isinstance(data, (list, tuple)):
        return [masked(item, secrets) for item in data]
    if isinstance(data, dict):
        return {key: masked(value, secrets) for key, value in data.items()}
    return data


def names_in(data: Any, secrets: Sequence[tuple[str, str]]) -> list[str]:
    """The names of the secrets whose values appear in `data` (what masked() hides)."""
    return sorted({name for name, value in secrets if masked(data, [(name, value)]) != data})


def unmask(text: str, values: Mapping[str, str]) -> str:
    """The reverse of mask_text for the names in `values`: $NAME (not $NAME_MORE) -> value."""
    for name, value in values.items():
        text = re.sub(rf"\${re.escape(name)}(?![A-Za-z0-9_])", value.replace("\\", "\\\\"), text)
    return text


def masked_again(data: Any, values: Mapping[str, str]) -> Any:
    """`masked` undone for the names in `values` (rerun: a record's $NAME -> the value)."""
    if not values:
        return data
    if isinstance(data, str):
        return unmask(data, values)
    if isinstance(data, (list, tuple)):
        return type(data)(masked_again(item, values) for item in data)
    if isinstance(data, dict):
        return {key: masked_again(value, values) for key, value in data.items()}
    return data
