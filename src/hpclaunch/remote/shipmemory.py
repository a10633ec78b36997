"""Which folder a laptop folder outside git shipped as (`--ship DIR`), remembered on the
laptop so that later commands from there name that project: only run and sweep take
--ship, and without it `status`, `logs`, `cancel`, ... had no project to send, so `last`
over --remote was anyone's run (issue 29: over --remote, `last` is the shipped
project's). The memory is the user's own: `$XDG_DATA_HOME/hpclaunch/shipped.json`
beside the run index, 0600 in a 0700 folder; {laptop folder: the folder it shipped}."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from hpclaunch.basics import filemodes
from hpclaunch.records import index

FILE_NAME = "shipped.json"


def memory_path(environ: Mapping[str, str]) -> Path:
    return index.path(environ).parent / FILE_NAME


def remember(cwd: Path, shipped: Path, environ: Mapping[str, str]) -> None:
    """After `--ship DIR` from `cwd`: both `cwd` and the shipped folder name it from now
    on (the latest ship from a folder wins). A memory that cannot be written costs only
    this: later commands there find anyone's `last`, as before."""
    path = memory_path(environ)
    known = _read(path)
    root = str(shipped.resolve())
    known.update({str(cwd.resolve()): root, root: root})
    with contextlib.suppress(OSError):
        filemodes.make_dirs(path.parent, "private")
        filemodes.write_atomic(path, json.dumps(known, indent=1, sort_keys=True) + "\n")


def recall(cwd: Path, environ: Mapping[str, str]) -> Optional[Path]:
    """The folder shipped from `cwd`, or from the nearest folder above it that shipped
    one (a command from a subfolder is for the same project), else None."""
    known = _read(memory_path(environ))
    here = cwd.resolve()
    for folder in (here, *here.parents):
        if str(folder) in known:
            return Path(known[str(folder)])
    return None


def _read(path: Path) -> dict[str, str]:
    """The memory, or nothing where it is missing or unreadable (never an error: it only
    narrows `last`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}
