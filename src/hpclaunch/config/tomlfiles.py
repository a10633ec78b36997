"""TOML files a user writes (hpclaunch.toml, cluster profiles): read with one clear line
for every way a file can be damaged or foreign, merged table by table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hpclaunch.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 only
    import tomli as tomllib


def read_toml(path: Path, field: str) -> dict[str, Any]:
    """The file's tables; UserError naming the file and the way out when it cannot be
    read, is not UTF-8, or is not TOML."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(
            field, f"cannot read {path}: {exc.strerror}", "", "Check the path"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            field,
            f"{path} is not UTF-8 text (byte {exc.start})",
            "TOML files are UTF-8",
            "Save it as UTF-8 or remove the file",
        ) from None
    return loads(text, path, field)


def loads(text: str, path: Path, field: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(field, f"{path} is not valid TOML: {exc}", "", "Fix the file") from None
    return data


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep merge of TOML tables: `over` wins key by key."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
