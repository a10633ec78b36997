"""`hpclaunch.call` and `hpclaunch.submit`: a Python function called on every rank of a
job, its results back in rank order.

A call is a run: the one launch path (launching.plan_run/start) with a program that is
`python -I -c <trampoline>` running the shipped node/callrank.py, the pickled call and
cloudpickle written into the run folder before the job starts (calls/files.py). So it
is planned, placed (a step inside an allocation), recorded, listed and cancelled like
any run; its record's command is the function's qualified name.

The function's own keyword arguments pass through untouched: the run options are a
mapping of their own, `options=`. PEP 612 allows no keyword between `*args: P.args` and
`**kwargs: P.kwargs`, so the arguments are not checked against fn's (the result is).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Callable, Generic, Optional, TypeVar, Union

from hpclaunch import api, launching
from hpclaunch.basics import states
from hpclaunch.calls import files, pythons, typedoptions
from hpclaunch.calls.outcome import Results, outcome
from hpclaunch.config.options import RunOptions
from hpclaunch.errors import UserError, show
from hpclaunch.handle import Run
from hpclaunch.planning.validate import default_job_name

T = TypeVar("T")
_HERE_ONLY = ("cwd", "environ")  # api.run's own keywords a call takes too (not remote=)
MAX_JOB_NAME = 200  # planning/validate's limit on --job-name


class Call(Generic[T]):
    """A submitted call: `.result(timeout)`, `.done()`, `.cancel()`, `.run` (its Run)."""

    def __init__(self, run: Run, world: int, limit: int) -> None:
        self.run = run
        self._world = world
        self._limit = limit
        self._results: Optional[Results[T]] = None

    def __repr__(self) -> str:
        return f"Call({self.run.id!r}, state={self.run.state!r})"

    def done(self) -> bool:
        return self._results is not None or not states.is_open(self.run.state)

    def result(self, timeout: Optional[float] = None) -> Results[T]:
        """Every rank's return value in rank order, once the run ends; the first failing
        rank's exception raised again. TimeoutError after `timeout` s (the run goes on)."""
        if self._results is None:
            code = self.run.wait(timeout)

            def ended() -> str:
                return (
                    f"run {self.run.id} ended {self.run.state}, exit code {code}; "
                    f"`hpclaunch logs {self.run.id}` shows its output"
                )

            self._results = outcome(
                self.run.run_dir / files.CALL_DIR, self._world, self._limit, ended
            )
        return self._results

    def cancel(self) -> None:
        self.run.cancel()


def call(
    fn: Callable[..., T],
    *args: Any,
    options: Union[Mapping[str, Any], RunOptions, None] = None,
    **kwargs: Any,
) -> Results[T]:
    """Run fn(*args, **kwargs) on every rank of a job (`options`: `hpclaunch run`
    options, e.g. {"nodes": 2, "tasks_per_node": 2}, or a hpclaunch.RunOptions); the
    results in rank order."""
    return submit(fn, *args, options=options, **kwargs).result()


def submit(
    fn: Callable[..., T],
    *args: Any,
    options: Union[Mapping[str, Any], RunOptions, None] = None,
    **kwargs: Any,
) -> Call[T]:
    """Start `call` and return its handle at once."""
    if not callable(fn):
        raise UserError("call", f"{show(fn)} is not callable", "", "")
    given = typedoptions.given(options)
    limit = files.limit_bytes(given.pop(files.LIMIT_KEY, files.DEFAULT_LIMIT))
    here = {key: given.pop(key) for key in _HERE_ONLY if key in given}
    unknown = sorted(key for key in given if key not in api.BY_NAME_DEST)
    if unknown:
        raise UserError(
            "options",
            f"{unknown[0]!r} is not a run option",
            "the keys are hpclaunch.run's keywords, e.g. nodes, tasks_per_node, cluster",
            "pass the function's own keyword arguments beside options=, not in it",
        )
    typed = api._typed_options({k: v for k, v in given.items() if v is not None})
    data = files.payload(fn, args, kwargs, limit)
    req = api.request(
        files.program(sys.executable), typed, cwd=here.get("cwd"), environ=here.get("environ")
    )
    planned = launching.plan_run(req)
    if planned.spec.container or planned.spec.venv:
        # The ranks run in an image or a venv of their own (given here, in hpclaunch.toml
        # or the profile): its python3, not this interpreter (a shared file system's venv,
        # as for submitit).
        req = replace(req, program=files.program("python3"))
        planned = launching.plan_run(req)
    pythons.check(planned.spec)
    name = files.qualified_name(fn)
    if planned.spec.job_name == default_job_name(req.program):
        # Named by the function (runs' NAME column, squeue), not by the interpreter that
        # runs it; a job name given here, in hpclaunch.toml or the profile stays.
        req = replace(req, options={**req.options, "job_name": name[:MAX_JOB_NAME]})
    # Listed by the function's name (runs, show); the real program stays beside it.
    shown = (("command", [name]), ("call", {"fn": name, "program": list(req.program)}))
    req = replace(req, files=files.run_files(data), recorded=shown)
    started = launching.start(req, launching.plan_run(req))
    world = started.spec.world_size if started.spec else 1
    return Call(Run(started.paths.run_dir, started), world, limit)
