"""The one owner of a run's life: request -> plan -> run folder -> backend.start ->
record and index -> (wait) -> final state. Written once for every backend.

`prepare` writes nothing (a dry-run stops after it); `start` makes the run folder,
packs staged data, hands the plan to the backend and records the job; `finish` waits
through the backend and records how the run ended. Nothing here prints unless the
caller passes streams (the CLI does; the Python API stays quiet by default).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, TextIO

from hpclaunch import node
from hpclaunch.backends import pick
from hpclaunch.backends.base import Backend, Launch
from hpclaunch.basics import filemodes
from hpclaunch.basics.states import State
from hpclaunch.config import secretnames
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.errors import HpclaunchError, SetupFailed
from hpclaunch.node.stage_guard import signals_held
from hpclaunch.payload import codeplan, project
from hpclaunch.payload.snapshot import human
from hpclaunch.planning.preparing import Prepared, prepare_spec
from hpclaunch.records import index, runpaths, runrecord
from hpclaunch.script import render, runfolder


@dataclass(frozen=True)
class LaunchRequest:
    """What to run, as the CLI or the API received it."""

    options: Mapping[str, Any]  # option dest -> value (CLI strings or typed API values)
    program: tuple[str, ...]
    cwd: Path
    environ: Mapping[str, str]  # the requester's environment: the only one used
    reuse_code: Optional[Path] = None  # rerun: start in this earlier snapshot
    argv: Sequence[str] = ()  # hpclaunch's own command line, for the record
    # Files the ranks read, written into the run folder before the job starts (a call's
    # pickled function, calls/files.py): (path relative to the run folder, bytes).
    files: tuple[tuple[str, bytes], ...] = ()
    # Keys run.json records over the request's own (a call: `command` is the function's
    # qualified name, `call` its real program).
    recorded: tuple[tuple[str, Any], ...] = ()
    attached: bool = False  # the caller waits for the run next (Launch.attached)


@dataclass(frozen=True)
class Planned:
    """A run planned to the last byte, nothing written yet (what --dry-run shows)."""

    prepared: Prepared
    plan: render.BatchPlan
    paths: runpaths.RunPaths
    code: codeplan.CodePlan
    backend: Backend  # chosen once, here; it renders its own request (dry_run)
    notes: tuple[str, ...] = ()  # said on stderr before anything happens

    @property
    def spec(self) -> JobSpec:
        return self.prepared.spec


@dataclass
class Started:
    """A run whose job the backend accepted."""

    run_id: str
    paths: runpaths.RunPaths
    job_id: str
    backend: Backend
    spec: Optional[JobSpec]  # None for a run found again from its record
    job_ids: tuple[str, ...] = ()  # a --chain's members (job_id is the first)
    # Warnings about the record or the index of a job that runs anyway (a full disk).
    notes: tuple[str, ...] = ()


def plan_run(req: LaunchRequest) -> Planned:
    prepared = prepare_spec(req.options, req.program, req.cwd, req.environ)
    backend = pick(prepared.profile, prepared.in_allocation)
    spec = prepared.spec
    paths = runpaths.plan_paths(spec.run_root, spec.exp, spec.checkpoint_root, req.cwd)
    code = codeplan.plan_code(spec, req.cwd, paths, req.reuse_code)
    spec, batch = _render(spec, prepared, paths, code.cwd)
    notes = list(prepared.warnings)
    if code.note:
        notes.append(code.note)
    return Planned(replace(prepared, spec=spec), batch, paths, code, backend, tuple(notes))


def _render(
    spec: JobSpec, prepared: Prepared, paths: runpaths.RunPaths, job_cwd: Path
) -> tuple[JobSpec, render.BatchPlan]:
    """The batch plan for a job that starts in job_cwd (the snapshot, when there is one)."""
    if spec.container and spec.container.cwd != str(job_cwd):
        spec = replace(spec, container=replace(spec.container, cwd=str(job_cwd)))
    return spec, render.plan_batch(spec, prepared.profile, paths, job_cwd)


def dry_run_notes(planned: Planned) -> list[str]:
    code = planned.code
    if code.plan is None:
        return []
    return [
        f"hpclaunch: the job would run a code snapshot: {len(code.plan.files)} entries "
        f"({human(code.plan.total_bytes)}) copied to {code.cwd}"
    ]


def preview(planned: Planned, environ: Mapping[str, str], as_json: bool) -> str:
    """What the chosen backend would start (its own request), nothing started."""
    spec = planned.spec
    launch = Launch(spec, planned.plan, planned.paths, planned.code.cwd, environ)
    shown = planned.backend.dry_run(launch)
    secrets = spec.masked_secrets()
    if as_json:
        data = {
            "run_id": planned.paths.run_id,
            "run_dir": str(planned.paths.run_dir),
            "cluster": spec.cluster,
            **secretnames.masked(dict(shown.data), secrets),
            "spec": spec.to_record(),
            "in_allocation": planned.prepared.in_allocation,
        }
        return json.dumps(data, indent=2) + "\n"
    return secretnames.mask_text(shown.text, secrets)


def start(req: LaunchRequest, planned: Planned, backend: Optional[Backend] = None) -> Started:
    """Make the run folder, hand the plan to the backend (the profile's, unless one is
    given), record and index the job. Nothing is left behind when any step before the
    backend's acceptance fails."""
    spec, prepared = planned.spec, planned.prepared
    if spec.container and spec.container.mount_points:
        from hpclaunch.payload.containers import make_mount_points

        make_mount_points(spec.container)
    paths = runpaths.create(planned.paths, spec.share)
    code, batch = planned.code, planned.plan
    if paths.run_id != planned.paths.run_id:  # the id changed on a collision: re-plan
        code = codeplan.plan_code(spec, req.cwd, paths, req.reuse_code)
        spec, batch = _render(spec, prepared, paths, code.cwd)
    if backend is None:
        backend = planned.backend
    try:
        with filemodes.writing(spec.share):  # no process starts in here but git and tar
            entry = codeplan.write_code(code, paths, runpaths.absolute(spec.run_root, req.cwd))
            _write_run_files(paths, spec, batch, backend, req, entry)
            _write_extra_files(paths.run_dir, req.files, spec.share)
            if prepared.after:
                runrecord.update(paths.run_dir, after=[a.to_record() for a in prepared.after])
            if spec.stage:
                from hpclaunch.payload import stage, stagecache

                # Packed here, where the run starts (never on a dry-run); stage.json again,
                # now with each part's size and mtime.
                limits = stagecache.limits(prepared.profile)
                stage.pack_all(spec.stage, limits=limits, environ=req.environ)
                runrecord.write_json(
                    paths.run_dir / node.STAGE_JSON, render.stage_json(spec, paths)
                )
        launch = Launch(spec, batch, paths, code.cwd, req.environ, attached=req.attached)
        job_id = backend.start(launch)
    except OSError as exc:
        runpaths.remove(paths)
        raise HpclaunchError(f"cannot write the run directory {paths.run_dir}: {exc}") from None
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP while packing or staging
        _record_interrupted(req, spec, paths, exc)
        raise
    except SetupFailed as exc:  # the user's own lines failed: keep what says why
        _record_setup_failed(req, spec, paths, exc)
        raise
    except BaseException:
        runpaths.remove(paths)  # nothing is left behind when Slurm refuses the job
        raise
    state = (State.RUNNING if backend.foreground else State.PENDING).value
    extra: dict[str, Any] = {"job_ids": [job_id], **backend.record_extra(job_id)}
    entry = {
        "run_id": paths.run_id,
        "run_dir": str(paths.run_dir),
        "job_id": job_id,
        **({"job_ids": extra["job_ids"]} if len(extra["job_ids"]) > 1 else {}),
        "exp": spec.exp,
        "cluster": spec.cluster,
        "submitted_at": time.time(),
    }
    notes = _record_accepted(req, paths, job_id, {"state": state, **extra}, entry)
    return Started(
        paths.run_id, paths, job_id, backend, spec, tuple(extra["job_ids"]), tuple(notes)
    )


def _record_accepted(
    req: LaunchRequest,
    paths: runpaths.RunPaths,
    job_id: str,
    changes: dict[str, Any],
    entry: dict[str, Any],
) -> list[str]:
    """Record and index a job the backend accepted. The job runs whatever happens here,
    so a file system that fails now (full, no locks that work) never fails the command:
    the warnings returned name the job, the run folder and the fix."""
    notes: list[str] = []
    try:
        runrecord.update(paths.run_dir, job_id=job_id, **changes)
    except (OSError, HpclaunchError) as exc:
        notes.append(
            f"job {job_id} runs, but its record {paths.record} could not be updated "
            f"({_why(exc)}): hpclaunch cannot follow it. Watch it with squeue -j {job_id}, "
            f"end it with scancel {job_id}; free space or fix that file system before the "
            "next run"
        )
    try:
        index.add(entry, req.environ, req.cwd)
    except OSError as exc:
        notes.append(
            f"job {job_id} runs (folder {paths.run_dir}), but the run index "
            f"{index.path(req.environ)} could not be written ({_why(exc)}): "
            "`hpclaunch runs` will not list it. Free space there before the next run"
        )
    return notes


def _why(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _record_interrupted(
    req: LaunchRequest, spec: JobSpec, paths: runpaths.RunPaths, exc: KeyboardInterrupt
) -> None:
    """Nothing remains of a run interrupted while it started but its record, which
    says how it ended (and the index, so that `hpclaunch runs` shows it)."""
    signum = getattr(exc, "signum", signal.SIGINT)
    if not paths.record.exists():
        runpaths.remove(paths)  # interrupted before the record was written: nothing remains
        return
    runpaths.strip_to_record(paths)
    runrecord.update(
        paths.run_dir,
        state=State.CANCELLED.value,
        exit_code=128 + signum,
        reason=f"interrupted by {signal.Signals(signum).name} while the run was starting",
        ended_at=time.time(),
    )
    index.add(
        {"run_id": paths.run_id, "run_dir": str(paths.run_dir), "job_id": None,
         "exp": spec.exp, "cluster": spec.cluster, "submitted_at": time.time()},
        req.environ,
        req.cwd,
    )  # fmt: skip


def _record_setup_failed(
    req: LaunchRequest, spec: JobSpec, paths: runpaths.RunPaths, exc: SetupFailed
) -> None:
    """A --setup line failed before any rank started (here): the run folder stays, with
    logs/batch.out, and its record says FAILED and why; the index lists it."""
    if not paths.record.exists():
        return
    runrecord.update(
        paths.run_dir,
        state=State.FAILED.value,
        exit_code=exc.returncode,
        reason=exc.reason,
        ended_at=time.time(),
    )
    with contextlib.suppress(OSError):
        index.add(
            {"run_id": paths.run_id, "run_dir": str(paths.run_dir), "job_id": None,
             "exp": spec.exp, "cluster": spec.cluster, "submitted_at": time.time()},
            req.environ,
            req.cwd,
        )  # fmt: skip


def _write_run_files(
    paths: runpaths.RunPaths,
    spec: JobSpec,
    batch: render.BatchPlan,
    backend: Backend,
    req: LaunchRequest,
    code: dict[str, Any],
) -> None:
    runfolder.write_files(paths, spec, batch.script, files=batch.files)
    created = runrecord.new_record(
        spec,
        paths,
        backend.name,  # a step of an allocation records "slurm" (step.py)
        **{**runrecord.as_recorded(req, spec.masked_secrets()), **dict(req.recorded)},
        job_id=None,
        state=State.CREATED.value,
        exit_code=None,
        cwd=str(req.cwd),
        code=code,
        git=project.git_state(req.cwd),
    )
    runrecord.write_new(created)


def _write_extra_files(run_dir: Path, files: Sequence[tuple[str, bytes]], share: str) -> None:
    for name, data in files:
        path = run_dir / name
        filemodes.make_dirs(path.parent, share)
        with open(filemodes.open_new(path, os.O_WRONLY | os.O_TRUNC, share), "wb") as fh:
            fh.write(data)


def finish(
    started: Started,
    out: TextIO,
    err: TextIO,
    *,
    is_tty: bool = False,
    timeout: Optional[float] = None,
) -> tuple[int, str]:
    """Wait through the backend, then record the final state and exit code."""
    code, state = started.backend.wait(
        started.job_id,
        started.paths,
        out,
        err,
        is_tty=is_tty,
        timeout=timeout,
        members=started.job_ids,
    )
    # A full disk: run.json keeps its last good state, which a later `runs` or `status`
    # brings up to date from Slurm (a local run's from its launcher's end).
    ended: dict[str, Any] = {"state": state, "exit_code": code, "ended_at": time.time()}
    run_dir = started.paths.run_dir
    from hpclaunch.backends.runstatus import setup_failure

    setup = setup_failure(run_dir, runrecord.read_events(run_dir))
    if setup and state == State.FAILED.value:  # the batch script stopped in a --setup line
        ended["reason"] = setup
    reason = started.backend.end_reason(started.job_id)
    if reason:  # a Ctrl-C: the user's, not a cancel
        ended["reason"] = reason
    # A Ctrl-C now arrives once the end is written (else a later refresh would take
    # the unwritten end for hpclaunch's own death).
    with signals_held(), contextlib.suppress(OSError, HpclaunchError):
        runrecord.update(run_dir, **ended)
    return code, state


def announce(stream: TextIO, started: Started, as_json: bool, **extra: object) -> None:
    """The run id and job id: one JSON object with --json, else one line."""
    paths, spec = started.paths, started.spec
    if as_json:
        data = {
            "run_id": paths.run_id,
            "job_id": started.job_id,
            "run_dir": str(paths.run_dir),
            "cluster": spec.cluster if spec else None,
            "exp": spec.exp if spec else None,
            **extra,
        }
        stream.write(json.dumps(data) + "\n")
    else:
        stream.write(
            f"run {paths.run_id}  {started.backend.kind} {started.job_id}  {paths.run_dir}\n"
        )
    stream.flush()
