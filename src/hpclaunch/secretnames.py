"""Which environment variable names are secrets: they never reach a file or a command
line (spec.json masks them, a laptop sends them to a cluster on SSH's standard input)."""

from __future__ import annotations

import re

_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def is_secret(name: str) -> bool:
    """Names that look secret never reach a file or a command line, only the environment."""
    return bool(_SECRET.search(name))
