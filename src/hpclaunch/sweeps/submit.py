"""A sweep from request to queued arrays: plan (nothing written: what --dry-run shows),
then start: the sweep folder, one code snapshot, the shipped files once, a folder per
point, and one sbatch call per array part (one for any sweep under MaxArraySize).

Every bad request is refused in `plan`, before anything is written or submitted.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from hpclaunch import launching
from hpclaunch.backends import pick
from hpclaunch.backends.base import ArrayLaunch
from hpclaunch.backends.base import ArrayPart as ArrayJob
from hpclaunch.basics import filemodes, users
from hpclaunch.config.secretnames import mask_text as masked
from hpclaunch.errors import HpclaunchError, UserError
from hpclaunch.records import index, pointrecords, runpaths, sweeprecord
from hpclaunch.script import render
from hpclaunch.sweeps import arrays, folder, script
from hpclaunch.sweeps.gridnames import env_only_note
from hpclaunch.sweeps.limits import asking_limits, queued_jobs, site_limits
from hpclaunch.sweeps.plans import SweepOptions, SweepPlan
from hpclaunch.sweeps.points import Point, build_points, check_placeholders

if TYPE_CHECKING:
    from hpclaunch.sweeps.local import LocalSweep

MAX_POINTS = 1_000_000  # beyond any site's queue; refused instantly, before building
TRIAL_MODULE = "hpclaunch.sweeps.pointcmd"


def _at_least_one(field: str, value: Optional[int]) -> None:
    if value is not None and value < 1:
        raise UserError(field, f"{value} is below 1", "at least 1", f"Give {field} 1 or more")


def sweep_points(
    req: launching.LaunchRequest, opts: SweepOptions
) -> tuple[list[Point], tuple[Any, ...]]:
    """The point table (Optuna: one empty point per trial) and the Optuna space."""
    for field, value in (
        ("--repeat", opts.repeat),
        ("--max-parallel", opts.max_parallel),
        ("--trials", opts.trials),
    ):
        _at_least_one(field, value)
    configs = Path(opts.configs) if opts.configs else None
    if configs is not None and not configs.is_absolute():
        configs = req.cwd / configs
    _at_least_one("--count", opts.count)
    if opts.wandb_sweep or opts.count is not None:
        if opts.grids or configs or opts.repeat or opts.optuna or not opts.count:
            raise UserError(
                "--wandb-sweep",
                "takes --count N and nothing else to sweep over",
                "W&B chooses the parameters",
                "Drop --grid/--configs/--repeat/--optuna",
            )
        return [Point(i, {}) for i in range(opts.count)], ()
    if not opts.optuna:
        if opts.trials is not None:  # --metric too names the best point (sweep status)
            raise UserError("--trials", "only with --optuna", "", "Add --optuna SPACE_FILE")
        points = build_points(opts.grids, configs, opts.repeat, MAX_POINTS)
        check_placeholders(req.program, points)
        return points, ()
    from hpclaunch.sweeps import space

    if opts.grids or configs or opts.repeat:
        raise UserError(
            "--optuna",
            "cannot be combined with --grid, --configs or --repeat",
            "",
            "Put every parameter in the space file",
        )
    if opts.trials is None or not opts.metric:
        missing = "--trials N" if opts.trials is None else "--metric NAME"
        raise UserError("--optuna", f"needs {missing}", "", f"Add {missing}")
    space.require_optuna()
    path = Path(opts.optuna) if Path(opts.optuna).is_absolute() else req.cwd / opts.optuna
    found = space.read_space(path)
    probe = [Point(0, {p.name: "" for p in found})]
    check_placeholders(req.program, probe)
    return [Point(i, {}) for i in range(opts.trials)], found


def plan_sweep(req: launching.LaunchRequest, opts: SweepOptions) -> SweepPlan:
    points, found_space = sweep_points(req, opts)
    if (opts.wandb_sweep or opts.count) and not req.program:
        req = replace(req, program=(WANDB_PROGRAM,))  # job.sh's line; the agent's replaces it
    with asking_limits(req.environ):  # site_limits' sacctmgr, asked with Slurm's facts
        planned = launching.plan_run(req)
    # The points' backend, asked once: a sweep is its own jobs, never steps of an
    # allocation this command runs in (sbatch works inside one too).
    runner = pick(planned.prepared.profile, in_allocation=False)
    planned = replace(
        planned, prepared=replace(planned.prepared, in_allocation=False), backend=runner
    )
    wb = _wandb(req, opts, planned)
    unused = env_only_note(req.program, points, opts.grids)
    planned = replace(planned, notes=(*planned.notes, *wb.notes, *filter(None, [unused])))
    spec, paths = planned.spec, planned.paths
    if spec.chain > 1:
        raise UserError(
            "--chain",
            "for a sweep",
            "each point is one array task",
            "Use --requeue: a point's task is requeued alone and resumes",
        )
    token = script.new_token()
    point = script.point_paths(paths, token)
    template = render.plan_batch(spec, planned.prepared.profile, point, planned.code.cwd).script
    parts: list[arrays.ArrayPart] = []
    trial_cmd = [sys.executable, "-m", TRIAL_MODULE] if found_space else None
    if not planned.backend.foreground:
        limits = site_limits(req)
        held, note = queued_jobs(limits, users.user_name(req.environ), len(points))
        arrays.check_fits(len(points), limits, held)
        if note:
            planned = replace(planned, notes=(*planned.notes, note))
        parts = arrays.split(range(len(points)), limits.max_array_size, opts.max_parallel)
        if trial_cmd:
            check_trial_python(trial_cmd)
    agent: list[str] = []
    take_over: list[str] = []
    if wb.sweep_id:
        from hpclaunch.sweeps import wandb

        python = planned.prepared.profile.python
        agent = wandb.agent_lines(spec, python, point, wb.sweep_id)
        take_over = [sys.executable, "-m", wandb.__name__]
    text = script.array_script(
        spec, paths, planned.code.cwd, len(points), trial_cmd, agent, take_over, token=token
    )
    return SweepPlan(
        planned, opts, points, token, template, text, parts, found_space, wb.sweep_id, wb.secret
    )


WANDB_PROGRAM = "the-W&B-sweep's-command"


def _wandb(req: launching.LaunchRequest, opts: SweepOptions, planned: launching.Planned) -> _Wandb:
    """W&B: the sweep id (command line over hpclaunch.toml), the API key as a secret,
    notes for stderr, and the agent command; all empty for other sweeps."""
    if not (opts.wandb_sweep or opts.count):
        return _Wandb()
    from hpclaunch.sweeps import wandb

    chosen, warning = wandb.chosen_sweep(opts.wandb_sweep, planned.prepared.project_file)
    if not chosen:
        raise UserError(
            "--count",
            "only with --wandb-sweep",
            "",
            "Add --wandb-sweep ENTITY/PROJECT/SWEEP_ID (or [sweep] wandb_sweep)",
        )
    sweep_id = wandb.check_sweep_id(chosen)
    if planned.spec.requeue:
        raise UserError(
            "--requeue",
            "with --wandb-sweep",
            "the W&B agent starts each point's run, and a requeued task would ask it anew",
            "Drop --requeue (or use --grid/--optuna, whose points resume)",
        )
    if planned.backend.foreground:
        raise UserError(
            "--wandb-sweep",
            "needs Slurm (each point is an array task)",
            "",
            "Run `wandb agent` here yourself, or use a Slurm cluster",
        )
    key = wandb.api_key(req.environ, planned.prepared.profile.wandb_credentials)
    notes = [warning] if warning else []
    if not key:
        notes.append(
            "hpclaunch: note: no WANDB_API_KEY and no wandb_credentials file: "
            "the agents use what `wandb login` left on the nodes"
        )
    notes += wandb.check_agent(req.environ, planned.spec)
    secret = ((wandb.API_KEY, key),) if key else ()
    return _Wandb(sweep_id, secret, tuple(notes))


@dataclass(frozen=True)
class _Wandb:
    sweep_id: Optional[str] = None
    secret: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()


def check_trial_python(trial_cmd: Sequence[str]) -> None:
    """Ask and tell run on the batch host with this hpclaunch: it must be importable with
    optuna by this interpreter, from a path the nodes share (not /tmp, node-local)."""
    import subprocess

    python = trial_cmd[0]
    where = [python, *(str(Path(m.__file__ or "").parent) for m in _modules())]
    private = [p for p in where if p.startswith(("/tmp/", "/dev/shm/"))]
    if private:
        raise UserError(
            "--optuna",
            f"{private[0]} is node-local",
            "ask and tell run on the batch host",
            "Install hpclaunch and optuna on shared storage",
        )
    probe = [python, "-c", f"import {TRIAL_MODULE}, optuna"]
    done = subprocess.run(probe, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(
            "--optuna",
            f"{python} cannot import hpclaunch and optuna ({last})",
            "",
            "pip install 'hpclaunch[optuna]' into that interpreter",
        )


def _modules() -> list[Any]:
    import optuna

    from hpclaunch import version  # in the package's own folder, without its face

    return [version, optuna]


def start(req: launching.LaunchRequest, sp: SweepPlan) -> dict[str, Any]:
    """Write the sweep and submit its arrays; returns the sweep record. Nothing is left
    behind (folder, index entry) when any step before Slurm's acceptance fails."""
    spec = sp.planned.spec
    if spec.container and spec.container.mount_points:
        from hpclaunch.payload.containers import make_mount_points

        make_mount_points(spec.container)
    paths = runpaths.create(sp.paths, spec.share)
    if paths.run_id != sp.paths.run_id:
        raise HpclaunchError(f"sweep id collision on {sp.paths.run_id}; run the command again")
    try:
        with filemodes.writing(spec.share):  # the folder, the points, the Optuna journal
            data = folder.write_sweep(req, sp)
            if sp.space:
                from hpclaunch.sweeps import trials

                trials.create_study(paths.run_dir, paths.run_id, sp.options.direction)
        job_ids = [] if sp.local else sp.backend.start_array(_launch(req, sp))
    except BaseException:
        runpaths.remove(paths)
        raise
    try:
        return _record_accepted(req, sp, paths, data, job_ids)
    except OSError as exc:  # a full disk after Slurm accepted: say what runs and the fix
        jobs = " ".join(job_ids) or "none"
        raise HpclaunchError(
            f"sweep {paths.run_id}: Slurm accepted arrays {jobs}, but {paths.run_dir} or "
            f"the run index could not be written ({exc.strerror or exc}). Cancel them "
            f"with scancel {jobs}, free space there, and submit again"
        ) from None


def _launch(req: launching.LaunchRequest, sp: SweepPlan) -> ArrayLaunch:
    # The W&B API key joins the plan's secrets: the job's environment, never a file.
    secret = (*sp.planned.plan.secret_env, *sp.secret_env)
    return array_launch(sp.paths.job_sh, sp.parts, req.environ, secret)


def _record_accepted(
    req: launching.LaunchRequest,
    sp: SweepPlan,
    paths: runpaths.RunPaths,
    data: dict[str, Any],
    job_ids: list[str],
) -> dict[str, Any]:
    spec = sp.planned.spec
    # The points' rows and shared record, not a run.json each (records/pointrecords.py).
    rows, common = folder.point_records(sp, data["backend"], job_ids)
    changes = {"points": rows, pointrecords.POINT_RECORD: common}
    arrays = {"arrays": array_entries(sp.parts, job_ids, attempt=1)} if job_ids else {}
    data = sweeprecord.update(paths.run_dir, **changes, **arrays)
    index.add(
        {
            "run_id": paths.run_id,
            "run_dir": str(paths.run_dir),
            "job_id": job_ids[0] if job_ids else None,
            "exp": spec.exp,
            "cluster": spec.cluster,
            "submitted_at": time.time(),
            "sweep": True,
            "points": len(sp.points),
        },
        req.environ,
        req.cwd,
    )
    return data


def local_sweep(environ: Mapping[str, str], sp: SweepPlan) -> LocalSweep:
    """What a foreground backend's runner needs to run the points here."""
    from hpclaunch.sweeps.local import LocalSweep

    planned = sp.planned
    return LocalSweep(
        sp.backend, planned.spec, planned.prepared.profile, planned.code.cwd, sp.paths.run_dir,
        sp.paths.run_id, sp.points, environ, sp.space, sp.options.metric,
    )  # fmt: skip


def replanned(data: Mapping[str, Any], environ: Mapping[str, str]) -> SweepPlan:
    """A recorded sweep planned again from its record (sweep retry of a sweep that runs
    here): the same options, program and cluster, the recorded points."""
    cluster = data.get("cluster")  # the recorded cluster, over the options' own
    options = {**dict(data.get("options") or {}), **({"cluster": cluster} if cluster else {})}
    req = launching.LaunchRequest(
        options, tuple(data.get("command") or ()), Path(str(data["cwd"])), environ
    )
    recorded = dict(data.get("sweep") or {})
    given: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()}
    opts = SweepOptions(**given)
    sp = plan_sweep(req, opts)
    points = [
        Point(int(p["index"]), dict(p.get("params") or {}), tuple(p.get("args") or ()))
        for p in data["points"]
    ]
    return replace(sp, points=points)


def array_launch(
    job_sh: Path,
    parts: Sequence[arrays.ArrayPart],
    environ: Mapping[str, str],
    secret_env: Sequence[tuple[str, str]] = (),
) -> ArrayLaunch:
    """What the backend needs to queue these parts of the sweep's array script."""
    planned = [ArrayJob(p.offset, p.spec()) for p in parts]
    return ArrayLaunch(job_sh, planned, environ, tuple(secret_env))


def array_entries(
    parts: Sequence[arrays.ArrayPart], job_ids: Sequence[str], attempt: int
) -> list[dict[str, Any]]:
    """sweep.json's record of the arrays one submission queued."""
    return [
        {
            "job_id": j,
            "offset": p.offset,
            "spec": p.spec(),
            "points": len(p.task_ids),
            "attempt": attempt,
            "submitted_at": time.time(),
        }
        for p, j in zip(parts, job_ids)
    ]


def _point_zero(sp: SweepPlan) -> str:
    """Point 0's job.sh as it will be: with its parameters where points run here; an
    array task's from point.sh, its parameters from its line of params.sh."""
    text = script.point_script(sp.point_template, sp.token, 0)
    if sp.space or not sp.points:
        return text
    sweep_id, total, first = sp.paths.run_id, len(sp.points), sp.points[0]
    if sp.local:
        return script.with_params(text, sweep_id, total, first)
    line = script.params_line(sweep_id, total, first)
    return f"{text.rstrip()}\n\n# point 0's line of params.sh, sourced before it:\n# {line}\n"


def describe(sp: SweepPlan, environ: Any) -> str:
    """The --dry-run text: the array script, the sbatch line(s), the point table."""
    out = [sp.array_script.rstrip("\n"), ""]
    if sp.local:
        out.append(
            f"# --cluster local: {len(sp.points)} points run here, "
            f"{sp.options.max_parallel or 1} at a time"
        )
    else:
        secret = {**dict(sp.planned.plan.secret_env), **dict(sp.secret_env)}
        out += script.submit_lines(sp.sbatch_argvs(), secret)
    out += [
        "",
        "# each point's job.sh (point 0 shown):",
        _point_zero(sp).rstrip("\n"),
        "",
    ]
    if sp.wandb_sweep:
        out.append(f"# {len(sp.points)} points, each one run of W&B sweep {sp.wandb_sweep}")
    elif sp.space:
        out.append(f"# {len(sp.points)} Optuna trials over: {', '.join(p.name for p in sp.space)}")
    else:
        out += script.preview_table(sp.points)
    # A secret's value met in the program or a --setup line: shown as $NAME (secretnames).
    return masked("\n".join(out) + "\n", sp.masked_secrets())


__all__ = ["describe", "plan_sweep", "start"]
