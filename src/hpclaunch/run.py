"""`run`: resolve the layers, plan, then dry-run, run locally, start a step in the current
allocation, or submit (and optionally wait). The library entry point behind the CLI."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Optional, TextIO

from . import __version__, config, render, run_code, runs, shell
from .errors import HpclaunchError
from .snapshot import human
from .spec import MASK, JobSpec, is_secret


@dataclass(frozen=True)
class RunRequest:
    options: Mapping[str, Any]
    program: tuple[str, ...]
    dry_run: bool = False
    wait: bool = False
    as_json: bool = False
    cwd: Optional[Path] = None
    environ: Optional[Mapping[str, str]] = None
    reuse_code: Optional[Path] = None  # rerun: start in this earlier snapshot
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)


def execute(req: RunRequest) -> int:
    cwd = req.cwd or Path.cwd()
    environ = dict(os.environ if req.environ is None else req.environ)
    resolved = config.resolve(req.options, req.program, cwd, environ, write=not req.dry_run)
    spec, profile = resolved.spec, resolved.profile
    for line in resolved.warnings:
        req.err.write(line if line.startswith("hpclaunch:") else f"hpclaunch: warning: {line}")
        req.err.write("\n")
    paths = runs.plan_paths(spec.run_root, spec.exp, spec.checkpoint_root, cwd)
    code = run_code.plan_code(spec, cwd, paths, req.reuse_code)
    spec, plan = _plan(spec, profile, paths, code.cwd)
    if code.note:
        req.err.write(code.note + "\n")
    if req.dry_run and code.plan is not None:
        req.err.write(
            f"hpclaunch: the job would run a code snapshot: {len(code.plan.files)} entries "
            f"({human(code.plan.total_bytes)}) copied to {code.cwd}\n"
        )

    if req.dry_run:
        return _dry_run(req, spec, plan, paths, resolved, environ)

    if spec.container and spec.container.mount_points:
        from .containers import make_mount_points

        make_mount_points(spec.container)
    paths = runs.create(paths)
    if paths.run_id not in str(plan.sbatch_argv):  # the id changed on a collision: re-plan
        code = run_code.plan_code(spec, cwd, paths, req.reuse_code)
        spec, plan = _plan(spec, profile, paths, code.cwd)
    backend = "local" if profile.kind == "local" else "slurm"
    try:
        entry = run_code.write_code(code, paths, runs.absolute(spec.run_root, cwd))
        _write_run_files(paths, spec, plan, backend, req, cwd, entry)
    except OSError as exc:
        runs.remove(paths)
        raise HpclaunchError(f"cannot write the run directory {paths.run_dir}: {exc}") from None
    except HpclaunchError:
        runs.remove(paths)
        raise

    if backend == "local":
        from .run_local import run_local_job

        return run_local_job(spec, plan, paths, code.cwd, environ, req.out, req.err, req.as_json)
    if resolved.in_allocation:
        from .run_step import run_step_job

        return run_step_job(spec, plan, paths, environ, req.out, req.err, req.as_json)
    return _submit(req, spec, plan, paths, environ)


def _plan(
    spec: JobSpec, profile: Any, paths: runs.RunPaths, job_cwd: Path
) -> tuple[JobSpec, render.BatchPlan]:
    """The batch plan for a job that starts in job_cwd (the snapshot, when there is one)."""
    if spec.container and spec.container.cwd != str(job_cwd):
        spec = replace(spec, container=replace(spec.container, cwd=str(job_cwd)))
    return spec, render.plan(spec, profile, paths, job_cwd)


def _dry_run(
    req: RunRequest,
    spec: JobSpec,
    plan: render.BatchPlan,
    paths: runs.RunPaths,
    resolved: config.Resolved,
    environ: Mapping[str, str],
) -> int:
    if req.as_json:
        data = {
            "run_id": paths.run_id,
            "run_dir": str(paths.run_dir),
            "cluster": spec.cluster,
            "script": plan.script,
            "sbatch": list(plan.sbatch_argv),
            "spec": spec.to_record(),
            "in_allocation": resolved.in_allocation,
        }
        req.out.write(json.dumps(data, indent=2) + "\n")
        return 0
    text = render.preview(plan, environ)
    if spec.cluster == "local" or resolved.in_allocation:
        where = "as local processes" if spec.cluster == "local" else "as a step of this allocation"
        text += (
            f"# --cluster {spec.cluster}: no sbatch; each task runs {where}:\n"
            f"#   {shell.command(list(plan.task_argv))}\n"
        )
    req.out.write(text)
    return 0


def _write_run_files(
    paths: runs.RunPaths,
    spec: JobSpec,
    plan: render.BatchPlan,
    backend: str,
    req: RunRequest,
    cwd: Path,
    code: dict[str, Any],
) -> None:
    # Arguments may hold any bytes (surrogate-escaped in Python): write them back as bytes.
    paths.job_sh.write_bytes(plan.script.encode("utf-8", "surrogateescape"))
    for name in ("bootstrap.py", *(("stage_node.py",) if spec.stage or spec.stage_out else ())):
        with resources.as_file(resources.files("hpclaunch").joinpath(name)) as src:
            shutil.copyfile(src, paths.run_dir / name)
    if spec.stage or spec.stage_out:
        runs.write_json(paths.run_dir / "stage.json", render.stage_json(spec, paths))
    runs.write_json(paths.run_dir / "spec.json", spec.to_record())
    record = {
        "run_id": paths.run_id,
        "exp": spec.exp,
        "cluster": spec.cluster,
        "backend": backend,
        "run_dir": str(paths.run_dir),
        "checkpoint_dir": str(paths.checkpoint_dir),
        "job_id": None,
        "submitted_at": time.time(),
        "state": "CREATED",
        "exit_code": None,
        "command": list(req.program),
        "argv": masked_argv(sys.argv),
        # What `rerun` needs: the options as given (secret values masked) and the folder.
        "options": masked_options(req.options),
        "cwd": str(cwd),
        "code": code,
        "hpclaunch_version": __version__,
        "nodes": spec.nodes,
        "tasks_per_node": spec.tasks_per_node,
        "launcher": spec.launcher,
        "job_name": spec.job_name,
        "git": config.git_state(cwd),
    }
    runs.write_json(paths.record, record)


def index(paths: runs.RunPaths, spec: JobSpec, job_id: str) -> None:
    runs.add_to_index(
        {
            "run_id": paths.run_id,
            "run_dir": str(paths.run_dir),
            "job_id": job_id,
            "exp": spec.exp,
            "cluster": spec.cluster,
            "submitted_at": time.time(),
        }
    )


def _submit(
    req: RunRequest,
    spec: JobSpec,
    plan: render.BatchPlan,
    paths: runs.RunPaths,
    environ: Mapping[str, str],
) -> int:
    from .backends import slurm

    try:
        job_id = slurm.submit(plan, environ)
    except HpclaunchError:
        runs.remove(paths)  # nothing is left behind when Slurm refuses the job
        raise
    runs.update_record(paths.run_dir, job_id=job_id, job_ids=[job_id], state="PENDING")
    index(paths, spec, job_id)
    announce(req.out, req.err, paths, spec, job_id, req.as_json, req.wait)
    if not req.wait:
        return 0
    return follow(job_id, paths.run_dir, req.out, req.err)


def announce(
    out: TextIO,
    err: TextIO,
    paths: runs.RunPaths,
    spec: JobSpec,
    job_id: str,
    as_json: bool,
    waiting: bool,
    kind: str = "job",
    **extra: object,
) -> None:
    """The run id and job id: one JSON object on stdout with --json, else one line (on
    stderr while the output of the job follows on stdout)."""
    stream = err if waiting and not as_json else out
    if as_json:
        record = {
            "run_id": paths.run_id,
            "job_id": job_id,
            "run_dir": str(paths.run_dir),
            "cluster": spec.cluster,
            "exp": spec.exp,
            **extra,
        }
        stream.write(json.dumps(record) + "\n")
    else:
        stream.write(f"run {paths.run_id}  {kind} {job_id}  {paths.run_dir}\n")
    stream.flush()


def follow(job_id: str, run_dir: Path, out: TextIO, err: TextIO) -> int:
    """Stream a submitted job until it ends; Ctrl-C detaches and says how to come back."""
    from .backends.slurm import SlurmStatus
    from .monitor import wait_and_stream

    try:
        code, state = wait_and_stream(
            SlurmStatus(), job_id, run_dir / "logs", out, err, is_tty=err.isatty()
        )
    except KeyboardInterrupt:
        err.write(
            f"\nhpclaunch: detached; job {job_id} keeps running.\n"
            f"  follow:  hpclaunch logs {job_id} --follow\n"
            f"  status:  hpclaunch status {job_id}\n"
            f"  cancel:  hpclaunch cancel {job_id}\n"
        )
        return 130
    runs.update_record(run_dir, state=state, exit_code=code, ended_at=time.time())
    if code != 0:
        err.write(f"hpclaunch: job {job_id} ended {state}, exit code {code}\n")
    return code


def masked_options(options: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key == "env" and isinstance(value, (list, tuple)):
            value = [
                f"{item.partition('=')[0]}={MASK}" if is_secret(item.partition("=")[0]) else item
                for item in value
            ]
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


def masked_argv(argv: list[str]) -> list[str]:
    """hpclaunch's own command line for the record, with secret `--env` values masked
    (the program's own arguments after `--` are kept: the job runs them anyway)."""
    out: list[str] = []
    value_next = False
    for index, arg in enumerate(argv):
        if arg == "--":
            return out + argv[index:]
        prefix = ""
        if value_next:
            text = arg
        elif arg.startswith("--env="):
            prefix, text = "--env=", arg[len("--env=") :]
        else:
            text = ""
        name, sep, _ = text.partition("=")
        out.append(f"{prefix}{name}={MASK}" if sep and is_secret(name) else arg)
        value_next = arg == "--env"
    return out
