"""hpclaunch: run a training program unchanged on Slurm clusters or locally.

The public API (imported lazily, so that `hpclaunch run` starts fast; docs/api.md):

    import hpclaunch
    run = hpclaunch.run(["python", "train.py"], nodes=2, tasks_per_node=2, cluster="local")
    code = run.wait()          # or run.follow() to stream the ranks' output
    print(run.state, run.result(), run.logs(rank=0))
    hpclaunch.get("last"), hpclaunch.runs(exp="default", state="FAILED")
    sums = hpclaunch.call(fn, x, options={"nodes": 2})   # fn(x) on every rank, in rank order

Every keyword of `run` is an `hpclaunch run` option (None: not given, so hpclaunch.toml
and the cluster profile apply). A bad request raises `UserError` (one line) before
anything is submitted; nothing prints unless asked.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hpclaunch.version import __version__

_EXPORTS = {
    "run": "api",
    "runs": "api",
    "get": "api",
    "call": "calls.calling",
    "submit": "calls.calling",
    "Call": "calls.calling",
    "Results": "calls.outcome",
    "RemoteError": "calls.outcome",
    "Run": "handle",
    "RemoteRun": "remote.handle",
    "RunRecord": "records.runrecord",
    "RunOptions": "config.options",
    "HpclaunchError": "errors",
    "UserError": "errors",
    "SlurmError": "errors",
    "State": "basics.states",
    "JobSpec": "config.jobspec",
    "Profile": "config.profiles",
    "load_profile": "config.profiles",
}

__all__ = [
    "Call",
    "HpclaunchError",
    "JobSpec",
    "Profile",
    "RemoteError",
    "RemoteRun",
    "Results",
    "Run",
    "RunOptions",
    "RunRecord",
    "SlurmError",
    "State",
    "UserError",
    "__version__",
    "call",
    "get",
    "load_profile",
    "run",
    "runs",
    "submit",
]

if TYPE_CHECKING:
    from hpclaunch.api import get, run, runs
    from hpclaunch.basics.states import State
    from hpclaunch.calls.calling import Call, call, submit
    from hpclaunch.calls.outcome import RemoteError, Results
    from hpclaunch.config.jobspec import JobSpec
    from hpclaunch.config.options import RunOptions
    from hpclaunch.config.profiles import Profile, load_profile
    from hpclaunch.errors import HpclaunchError, SlurmError, UserError
    from hpclaunch.handle import Run
    from hpclaunch.records.runrecord import RunRecord
    from hpclaunch.remote.handle import RemoteRun


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hpclaunch' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
