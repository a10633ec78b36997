"""The allocation of a `hpclaunch dev` session: a run like any other (the same options,
plan, container, venv, staging and record) whose ranks hold the nodes until the session
ends, then cancelled. A shell or a server joins it as an overlapping step (attach).

Its time limit is --time when given, else the profile's `dev_time` (2 h by default):
an interactive session left open should not hold GPUs for a partition's whole limit."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from hpclaunch import launching
from hpclaunch.backends import runstatus
from hpclaunch.basics import states
from hpclaunch.config import layering
from hpclaunch.config.profilekinds import runs_here
from hpclaunch.errors import UserError
from hpclaunch.handle import Run
from hpclaunch.observe import attach, waiting
from hpclaunch.planning.preparing import profile_for
from hpclaunch.records import runrecord
from hpclaunch.records.runrecord import RunRecord

# What every rank runs: nothing, until the session cancels the job (coreutils' sleep is
# in every image a job runs in; `infinity` is GNU's, and Slurm's limit ends it anyway).
HOLD = ("sleep", "infinity")
FIELD = "hpclaunch dev"


def session_options(
    options: Mapping[str, Any], cwd: Path, environ: Mapping[str, str]
) -> dict[str, Any]:
    """The run options of the allocation: the caller's, --time defaulting to the
    profile's dev_time; a local profile refused (no allocation to join)."""
    given = {k: v for k, v in options.items() if v is not None and v != ()}
    profile = profile_for(layering.cli_options(given).cluster, cwd, environ)
    if runs_here(profile.kind):
        raise UserError(
            "--cluster",
            f"{profile.name} runs jobs on this machine",
            "hpclaunch dev opens a session in a Slurm allocation",
            "Name a Slurm cluster (--cluster NAME), or run the program here directly",
        )
    given.setdefault("time", profile.dev_time)
    return given


def heartbeat_timeout(options: Mapping[str, Any], cwd: Path, environ: Mapping[str, str]) -> int:
    """The profile's dev_heartbeat_timeout: how long a laptop may stay silent."""
    cluster = layering.cli_options(options).cluster
    return profile_for(cluster, cwd, environ).dev_heartbeat_timeout


def start(
    options: Mapping[str, Any], cwd: Path, environ: Mapping[str, str], argv: Sequence[str]
) -> Run:
    """Submit the holding job; its handle (the caller cancels it in the end)."""
    req = launching.LaunchRequest(
        options=session_options(options, cwd, environ),
        program=HOLD,
        cwd=cwd,
        environ=environ,
        argv=tuple(argv),
        recorded=(("dev", True),),
    )
    started = launching.start(req, launching.plan_run(req))
    return Run(started.paths.run_dir, started)


def wait_running(
    run_dir: Path,
    say: Callable[[str], None],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RunRecord:
    """Until the job runs and every node's rank has started (then the step lands inside
    the container's environment at once): one status call per Poll, the events read in
    between. A job that ends first is one line."""
    poll = waiting.Poll(waiting.DEFAULT, clock())
    record = runrecord.load(run_dir)
    shown = ""
    while True:
        now = clock()
        if poll.is_due(now):
            record = runstatus.refresh_one(run_dir)
            phase = states.parse(record.state)
            if phase in states.TERMINAL:
                raise UserError(
                    "RUN",
                    f"the session's job {record.job_id} ended ({record.state})"
                    + (f": {record.reason}" if record.reason else ""),
                    "before the session began",
                    f"See hpclaunch logs {record.run_id}",
                )
            running = phase == states.State.RUNNING
            poll.asked(now, waiting.RUNNING if running else waiting.PENDING)
            if not running and record.state != shown:
                shown = record.state
                why = f" ({record.reason})" if record.reason and record.reason != "None" else ""
                say(f"hpclaunch: job {record.job_id} is {record.state}{why}: waiting for it")
        else:
            record = runrecord.load(run_dir)
        if states.parse(record.state) == states.State.RUNNING and attach.nodes_from_events(record):
            return record
        sleep(max(0.05, min(0.5, poll.due - clock())))


def end(run: Run) -> None:
    """Release the allocation (whatever ended the session); never raises for a job
    that is already gone."""
    with contextlib.suppress(UserError):
        run.cancel()


def node_of(record: RunRecord) -> Optional[str]:
    nodes = attach.nodes_from_events(record)
    return nodes[0] if nodes else None
