"""The typed Python API: `run()` starts a run and returns its `Run` handle; `runs()` lists
recorded runs; `get()` finds one. The CLI is a thin layer over the same code.

`run()` has one keyword argument per `hpclaunch run` option (options.OPTIONS), typed
(ints as ints, lists as lists) and None by default, meaning "not given", so the layers
of hpclaunch.toml and the cluster profile still apply. tests/test_api.py keeps
the signature equal to the registry. os.environ is read in one place, environ.py (light,
so the laptop's forwarding path need not import this module): everything after it takes
the request's environment.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Optional, Union

from hpclaunch import launching
from hpclaunch.backends import runstatus
from hpclaunch.basics import states
from hpclaunch.basics.environ import environment
from hpclaunch.config.options import BY_NAME, Option
from hpclaunch.errors import UserError, show
from hpclaunch.handle import Run
from hpclaunch.records import index, runrecord
from hpclaunch.remote.handle import RemoteRun

_API_ONLY = ("cwd", "environ", "remote")
# A list option takes a list (or tuple) of strings; a bare str is refused (by mypy too:
# a str is a Sequence[str], and env="A=1" would be read letter by letter).
StrList = Union[list[str], tuple[str, ...]]


def run(
    program: Union[str, Sequence[str]],
    *,
    cluster: Optional[str] = None,
    nodes: Optional[int] = None,
    tasks_per_node: Optional[int] = None,
    gpus_per_node: Optional[int] = None,
    cpus_per_task: Optional[int] = None,
    mem: Optional[str] = None,
    mem_per_gpu: Optional[str] = None,
    time: Optional[str] = None,
    partition: Optional[str] = None,
    account: Optional[str] = None,
    reservation: Optional[str] = None,
    qos: Optional[str] = None,
    constraint: Optional[str] = None,
    exclude: Optional[str] = None,
    nodelist: Optional[str] = None,
    exclusive: Optional[bool] = None,
    overcommit: Optional[bool] = None,
    job_name: Optional[str] = None,
    launcher: Optional[Literal["srun", "torchrun"]] = None,
    gpu_visibility: Optional[Literal["all", "per-task"]] = None,
    exp: Optional[str] = None,
    run_root: Optional[str] = None,
    share: Optional[Literal["private", "group"]] = None,
    env: Optional[StrList] = None,
    setup: Optional[StrList] = None,
    sbatch_arg: Optional[StrList] = None,
    container: Optional[str] = None,
    container_runtime: Optional[
        Literal["apptainer", "charliecloud", "pyxis", "ce", "podman-hpc"]
    ] = None,
    bind: Optional[StrList] = None,
    venv: Optional[str] = None,
    stage: Optional[StrList] = None,
    stage_out: Optional[StrList] = None,
    no_snapshot: Optional[bool] = None,
    snapshot_limit: Optional[str] = None,
    nccl_debug: Optional[bool] = None,
    profile_ranks: Optional[str] = None,
    profiler: Optional[Literal["py-spy", "nsys", "rocprof", "torch"]] = None,
    no_watch: Optional[bool] = None,
    watch_interval: Optional[float] = None,
    watch_window: Optional[float] = None,
    watch_warmup: Optional[float] = None,
    requeue: Optional[bool] = None,
    max_requeues: Optional[int] = None,
    requeue_signal: Optional[Literal["USR2", "USR1"]] = None,
    signal_before: Optional[int] = None,
    after: Optional[StrList] = None,
    chain: Optional[int] = None,
    preflight: Optional[bool] = None,
    spares: Optional[int] = None,
    cwd: Union[str, Path, None] = None,
    environ: Optional[Mapping[str, str]] = None,
    remote: Optional[str] = None,
) -> Union[Run, RemoteRun]:
    """Start PROGRAM (a list of words, or one string split like a shell would) as a run;
    returns at once with its handle. Raises UserError (one line) for a bad request,
    before anything is submitted or written. remote="HOST": on that cluster, over SSH
    (docs/remote.md); the handle then asks the cluster. See docs/api.md."""
    given = {k: v for k, v in locals().items() if k in BY_NAME_DEST and v is not None}
    if remote is not None:
        from hpclaunch.remote.handle import start as start_remote

        here = Path(cwd) if cwd is not None else Path.cwd()
        caller_env = environment() if environ is None else dict(environ)
        return start_remote(remote, _program(program), _typed_options(given), here, caller_env)
    return start(_program(program), _typed_options(given), cwd=cwd, environ=environ)


BY_NAME_DEST: Mapping[str, Option] = {opt.dest: opt for opt in BY_NAME.values()}


def start(
    program: tuple[str, ...],
    options: Mapping[str, Any],
    *,
    cwd: Union[str, Path, None] = None,
    environ: Optional[Mapping[str, str]] = None,
    argv: Sequence[str] = (),
) -> Run:
    req = request(program, options, cwd=cwd, environ=environ, argv=argv)
    started = launching.start(req, launching.plan_run(req))
    return Run(started.paths.run_dir, started)


def request(
    program: tuple[str, ...],
    options: Mapping[str, Any],
    *,
    cwd: Union[str, Path, None] = None,
    environ: Optional[Mapping[str, str]] = None,
    argv: Sequence[str] = (),
    reuse_code: Optional[Path] = None,
) -> launching.LaunchRequest:
    return launching.LaunchRequest(
        options=dict(options),
        program=program,
        cwd=Path(cwd) if cwd is not None else Path.cwd(),
        environ=environment() if environ is None else dict(environ),
        reuse_code=reuse_code,
        argv=tuple(argv),
    )


def runs(
    exp: Optional[str] = None,
    state: Optional[str] = None,
    *,
    limit: Optional[int] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> list[Run]:
    """Recorded runs, newest first (their states brought up to date in one call)."""
    found = recorded(exp, state, limit=limit, environ=environ)
    return [Run(record.path) for record in found]


def recorded(
    exp: Optional[str] = None,
    state: Optional[str] = None,
    *,
    limit: Optional[int] = None,
    environ: Optional[Mapping[str, str]] = None,
    warn: Optional[index.Warn] = None,
) -> list[runrecord.RunRecord]:
    """The records of the newest `limit` runs (of `exp`; in `state`, among every recorded
    run), brought up to date with one status call per backend. A damaged record is skipped (said
    through `warn`), never the end of the listing."""
    wanted = check_state(state) if state else None
    env = environment() if environ is None else environ
    entries = [
        e for e in index.live(env, warn) if not e.get("sweep") and (not exp or e.get("exp") == exp)
    ]
    found = []
    for entry in entries if wanted else entries[:limit]:  # a state: among every run
        try:
            found.append(runrecord.load(Path(entry["run_dir"])))
        except runrecord.DamagedRecord as exc:
            if warn is not None:
                warn(str(exc))
    return [r for r in runstatus.refresh(found) if wanted is None or r.state == wanted][:limit]


def check_state(state: str) -> str:
    """A state name as users write it (any case) -> Slurm's name; else one line naming
    the valid ones."""
    names = [s.value for s in states.State]
    if state.upper() not in names:
        raise UserError(
            "--state", f"{show(state)} is not a state", f"one of {', '.join(names)}", ""
        )
    return state.upper()


def get(ref: str, *, environ: Optional[Mapping[str, str]] = None, all_projects: bool = True) -> Run:
    """A run by id, unique id prefix, Slurm job id, run folder, or "last" (the newest run
    or sweep: of a sweep, its most recently started point); a sweep's point by
    "SWEEP:INDEX". "last" is anyone's newest, as a library call has no project of its
    own (run(cwd=...) starts runs anywhere); all_projects=False: the CLI's `last`, the
    newest of the project holding the current folder."""
    from hpclaunch.records.refs import run_dir

    env = environment() if environ is None else environ
    return Run(run_dir(ref, env, all_projects=all_projects))


def _program(program: Union[str, Sequence[str]]) -> tuple[str, ...]:
    words = shlex.split(program) if isinstance(program, str) else list(program)
    if not words:  # in the API's words: the CLI's "after --" means nothing to a caller
        raise UserError(
            "program",
            f"{show(program)} is empty",
            "",
            "Name the program and its arguments, e.g. hpclaunch.run(['python', 'train.py'])",
        )
    if not all(isinstance(word, str) for word in words):
        raise UserError("program", f"{show(words)} holds a non-string", "", "")
    return tuple(words)


_TYPES: Mapping[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "sbatch": (str,),
    "time": (str,),
    "mem": (str,),
    "flag": (bool,),
    "choice": (str,),
}


def _typed_options(given: Mapping[str, Any]) -> dict[str, Any]:
    """Refuse a value of the wrong type in one line (mypy refuses it before that)."""
    out: dict[str, Any] = {}
    for dest, value in given.items():
        opt = BY_NAME_DEST[dest]
        if opt.kind == "list":
            ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
            if ok:
                value = tuple(value)
        else:
            ok = isinstance(value, _TYPES[opt.kind]) and not (
                opt.kind in ("int", "float") and isinstance(value, bool)
            )
        if not ok:
            want = {
                "list": "a list of strings",
                "int": "an int",
                "float": "a number",
                "flag": "a bool",
            }
            raise UserError(
                dest,
                f"{show(value)} is {_a(type(value).__name__)}",
                f"expects {want.get(opt.kind, 'a str')}",
                f"Pass e.g. {dest}={_example(opt)}",
            )
        out[dest] = value
    return out


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def _example(opt: Option) -> str:
    return {"int": "2", "float": "2.0", "flag": "True", "list": '["..."]'}.get(opt.kind, '"..."')
