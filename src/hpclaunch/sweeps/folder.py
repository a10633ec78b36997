"""The sweep folder written: sweep.json, the array script, the shipped files once, the
code snapshot, point.sh and params.sh (what every point's array task makes its own), and
a folder per point with its run.json. Files in folders made moments ago are written plainly
(record.write_new): a sweep writes thousands of them, and sweep.json is the commit point."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from hpclaunch import launching, node
from hpclaunch.basics.states import State
from hpclaunch.config.secretnames import masked
from hpclaunch.payload import codeplan
from hpclaunch.records import runpaths, runrecord, sweeprecord
from hpclaunch.script import render, runfolder
from hpclaunch.sweeps import script
from hpclaunch.sweeps.plans import SweepPlan
from hpclaunch.sweeps.points import Point
from hpclaunch.version import __version__


def write_sweep(req: launching.LaunchRequest, sp: SweepPlan) -> dict[str, Any]:
    paths, spec, planned = sp.paths, sp.planned.spec, sp.planned
    code = codeplan.write_code(planned.code, paths, runpaths.absolute(spec.run_root, req.cwd))
    # The array script, the shipped files once for every point, spec.json: as for a run.
    runfolder.write_files(paths, spec, sp.array_script, stage_json=False, files=_edf(sp))
    if sp.wandb_sweep:  # the agent's side, run where each point's job runs
        shutil.copyfile(node.path(node.WANDB_AGENT), paths.shipped(node.WANDB_AGENT))
    if spec.stage:  # before the points' stage.json, which lists the parts packed
        from hpclaunch.payload import stage, stagecache

        limits = stagecache.limits(planned.prepared.profile)
        stage.pack_all(spec.stage, limits=limits, environ=req.environ)
    _write_points(sp)
    if sp.pack:  # pack.json, the node agent, the queue (sweeps/packplan.py)
        from hpclaunch.sweeps import packplan

        packplan.write(paths, sp.pack, spec)
    data = {
        "sweep_id": paths.run_id,
        "exp": spec.exp,
        "cluster": spec.cluster,
        "backend": sp.backend.name,
        "sweep_dir": str(paths.run_dir),
        "submitted_at": time.time(),
        **runrecord.as_recorded(req, sp.masked_secrets()),
        "sweep": sp.options.to_record(),
        "cwd": str(req.cwd),
        "code": code,
        "hpclaunch_version": __version__,
        "kind": "wandb" if sp.wandb_sweep else "optuna" if sp.space else "grid",
        **sp.backend.site_facts(),  # which sacct answers here: no call spent finding out
        "wandb_sweep": sp.wandb_sweep,
        "pack": [s.to_record() for s in sp.pack.slots] if sp.pack else None,
        "arrays": [],
        "space": [dict(p.__dict__) for p in sp.space],
        "points": [
            {"index": p.index, "params": dict(p.params), "args": list(p.args), "source": p.source}
            for p in sp.points
        ],
    }
    sweeprecord.write(paths.run_dir, data)
    return data


def _edf(sp: SweepPlan) -> tuple[tuple[str, str], ...]:
    """The CSCS Container Engine's EDF, one for every point (their srun lines name it)."""
    spec = sp.planned.spec
    if spec.container is None or spec.container.runtime != "ce":
        return ()
    point = script.point_paths(sp.paths, sp.token)
    return render.plan_batch(spec, sp.planned.prepared.profile, point, sp.planned.code.cwd).files


def _write_points(sp: SweepPlan) -> None:
    """A folder per point, but for the plain points of an array: their tasks make their
    folders, logs/ and checkpoints/ when they start (script.array_script), from what is
    written here once: point.sh (every point's job.sh, the token where the number goes)
    and params.sh (a line of exports a point; an Optuna point's ask writes its
    params.env); sweep.json holds their records until then (records/pointrecords.py).
    Array points that stage data, of a packed sweep, or with --checkpoint-root
    elsewhere: the folder and what they need first (stage.json; the checkpoint folder).
    Points run here (a foreground backend): job.sh with the point's parameters, logs/
    and checkpoints/, as a run's folder."""
    spec, sweep_id, total = sp.planned.spec, sp.paths.run_id, len(sp.points)
    template = script.point_paths(sp.paths, sp.token)  # the token where the number goes
    (sp.paths.run_dir / sweeprecord.POINTS).mkdir(exist_ok=True)
    if not sp.local:
        _write_sweep_level(sp)
    inside = template.checkpoint_dir.parent == template.run_dir
    staged = bool(spec.stage or spec.stage_out)
    if not (sp.local or sp.pack or staged or not inside):
        # Each task makes its folder when it starts, a host-side writer before then
        # (records/pointrecords.make_folder): 1,000 mkdirs here were the largest part
        # of a held sweep's submission on a busy file system.
        return
    stage_json = render.stage_json(spec, template)
    # Plain strings from the template's paths: pathlib per point (three paths, five
    # joins) was a sixth of a 1,000-point submission.
    run_dir, checkpoints = str(template.run_dir), str(template.checkpoint_dir)
    head, tail = script.split_head(sp.point_template)
    for point in sp.points:
        index = str(point.index)
        folder = run_dir.replace(sp.token, index)
        os.mkdir(folder)
        if not inside:  # --checkpoint-root elsewhere: <root>/<exp>/<sweep-id>/points/<i>/...
            os.makedirs(checkpoints.replace(sp.token, index), exist_ok=True)
        if sp.local:
            os.mkdir(f"{folder}/logs")
            if inside:
                os.mkdir(checkpoints.replace(sp.token, index))
            text = head.replace(sp.token, index)
            if not sp.space:  # an Optuna point's parameters come when it asks
                text += script.params_env(sweep_id, total, point)
            sweeprecord.write_new(f"{folder}/job.sh", text + tail.replace(sp.token, index))
        if staged:
            stage_json["run_dir"] = folder
            runrecord.write_json(Path(folder, node.STAGE_JSON), stage_json)


def _write_sweep_level(sp: SweepPlan) -> None:
    """point.sh, and params.sh but for Optuna: line i+1 holds point i's exports."""
    folder = sp.paths.run_dir
    sweeprecord.write_new(f"{folder}/{sweeprecord.POINT_SH}", sp.point_template)
    if sp.space:
        return
    sweep_id, total = sp.paths.run_id, len(sp.points)
    lines = [""] * (max((p.index for p in sp.points), default=-1) + 1)
    for point in sp.points:
        lines[point.index] = script.params_line(sweep_id, total, point)
    sweeprecord.write_new(
        f"{folder}/{sweeprecord.PARAMS_SH}", "".join(f"{line}\n" for line in lines)
    )


def point_record(
    sp: SweepPlan, point: Point, backend: str, job: Optional[str], **facts: Any
) -> runrecord.RunRecord:
    """A point's run.json: a run record like any other (status/logs/show SWEEP:I)."""
    spec, paths = sp.planned.spec, script.point_paths(sp.paths, str(point.index))
    return runrecord.new_record(
        spec,
        paths,
        backend,
        sweep_id=sp.paths.run_id,
        point=point.index,
        job_id=job,
        job_ids=[job] if job else [],
        attempts=1,
        state=State.PENDING.value,
        exit_code=None,
        command=masked([*spec.program, *point.args], sp.masked_secrets()),
        params=dict(point.params),
        **facts,
    )


def point_records(
    sp: SweepPlan, backend: str, job_ids: Sequence[str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What sweep.json keeps so that every point's run record can be made from it
    (records/pointrecords.py) instead of 1,000 run.json files written at submission: the
    point table's rows with each point's array task ("123_4") and command, and the record
    all points share, TOKEN where a point's number goes (its POINT_RECORD)."""
    task_of = {pt: f"{j}_{pt - p.offset}" for p, j in zip(sp.parts, job_ids) for pt in p.points()}
    if sp.pack and job_ids:  # any allocation's agent may run any point: the array's id
        task_of = {p.index: job_ids[0] for p in sp.points}
    secrets = sp.masked_secrets()
    program = list(sp.planned.spec.program)
    rows = []
    for point in sp.points:
        rows.append(
            {
                "index": point.index,
                "params": dict(point.params),
                "args": list(point.args),
                "source": point.source,
                "job": task_of.get(point.index),
                "command": [str(word) for word in masked([*program, *point.args], secrets)],
            }
        )
    spec, paths = sp.planned.spec, script.point_paths(sp.paths, sp.token)
    common = runrecord.new_record(
        spec, paths, backend, sweep_id=sp.paths.run_id, point=None, job_id=None,
        job_ids=[], attempts=1, state=State.PENDING.value, exit_code=None, command=[],
        params={}, **sp.backend.site_facts(), **({"packed": True} if sp.pack else {}),
    )  # fmt: skip
    return rows, {"token": sp.token, "base": common.to_dict()}
