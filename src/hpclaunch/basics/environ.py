"""The one reader (and, for a laptop's request, writer) of this process's environment.

Everything else takes the environment it was handed: the API's request, the CLI's
environ(). Kept apart from api.py so that a command forwarded to a cluster over SSH
starts without importing the launching machinery.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def environment() -> dict[str, str]:
    """This process's environment: read here only, then handed on with the request."""
    return dict(os.environ)


def apply_environment(extra: Mapping[str, str]) -> None:
    """Variables a laptop sent over SSH's standard input (secrets among them) become this
    process's own, so every later reader sees them as if set on the login node."""
    os.environ.update(extra)
