"""hpclaunch: run a training program unchanged on Slurm clusters or locally.

The public API (imported lazily, so that `hpclaunch run` starts fast):

    from hpclaunch import RunRequest, execute
    execute(RunRequest(options={"nodes": "2", "tasks_per_node": "2", "cluster": "local"},
                       program=("python", "train.py")))

`options` takes the long option names of `hpclaunch run` (with `_` for `-`) as strings,
exactly as the command line would; every user error raises `UserError`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "HpclaunchError": "errors",
    "UserError": "errors",
    "SlurmError": "errors",
    "JobSpec": "spec",
    "Profile": "profiles",
    "load_profile": "profiles",
    "RunRequest": "run",
    "execute": "run",
}

__all__ = [
    "HpclaunchError",
    "JobSpec",
    "Profile",
    "RunRequest",
    "SlurmError",
    "UserError",
    "__version__",
    "execute",
    "load_profile",
]

if TYPE_CHECKING:
    from .errors import HpclaunchError, SlurmError, UserError
    from .profiles import Profile, load_profile
    from .run import RunRequest, execute
    from .spec import JobSpec


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hpclaunch' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
