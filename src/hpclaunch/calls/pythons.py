"""The job's Python against the caller's, before a call is submitted: a pickled function
needs the same major.minor. Known here for a venv on this machine (its pyvenv.cfg) and a
directory image (its usr/bin/python3); anything else (a SIF or squashfs image, a venv
inside an image) is checked by each rank (node/callrank.py), one line in its exception.
Without container= or venv= the ranks run this very interpreter."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Optional

from hpclaunch.config.jobspec import JobSpec
from hpclaunch.errors import UserError

_VERSION = re.compile(r"^python(\d+)\.(\d+)$")
_CFG = re.compile(r"^\s*(?:version|version_info)\s*=\s*(\d+)\.(\d+)", re.MULTILINE)


def check(spec: JobSpec, caller: tuple[int, int] = sys.version_info[:2]) -> None:
    """UserError in one line when the job's Python is known here and differs: the
    planned run's venv (its pyvenv.cfg) or container image (a directory image's python3);
    a venv in an image decides over the image."""
    image = spec.container.image if spec.container else ""
    for field, value in (("venv", spec.venv), ("container", image)):
        if not value:
            continue
        path = Path(value)
        found = venv_python(path) if field == "venv" else image_python(path)
        if found is not None and found != caller:
            mine, theirs = "%d.%d" % caller, "%d.%d" % found  # noqa: UP031 - two ints
            raise UserError(
                field,
                f"{value} has Python {theirs}",
                f"hpclaunch.call pickles the function with Python {mine}: the same major.minor",
                f"call from a Python {theirs}, or give a {field} with Python {mine}",
            )
        return


def venv_python(venv: Path) -> Optional[tuple[int, int]]:
    try:
        text = (venv / "pyvenv.cfg").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None  # not on this machine (inside an image, say): the ranks check
    match = _CFG.search(text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def image_python(image: Path) -> Optional[tuple[int, int]]:
    """The version `python3` names in a directory image (usr/bin/python3 -> python3.X)."""
    for folder in ("usr/local/bin", "usr/bin"):
        try:
            target = os.readlink(image / folder / "python3")
        except OSError:
            continue
        match = _VERSION.match(os.path.basename(target))
        if match:
            return int(match.group(1)), int(match.group(2))
    return None
