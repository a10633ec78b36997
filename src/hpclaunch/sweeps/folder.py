"""The sweep folder written: sweep.json, the array script, the shipped files once, the
code snapshot, and a folder per point (job.sh numbered from the template, params.env,
run.json). Files in folders made moments ago are written plainly (record.write_new):
a sweep writes thousands of them, and sweep.json is the commit point."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from .. import __version__, codeplan, launching, node, records, render, rundirs, runfolder
from ..secretnames import masked
from ..states import State
from . import record, script
from .plans import SweepPlan
from .points import Point


def write_sweep(req: launching.Request, sp: SweepPlan) -> dict[str, Any]:
    paths, spec, planned = sp.paths, sp.planned.spec, sp.planned
    code = codeplan.write_code(planned.code, paths, rundirs.absolute(spec.run_root, req.cwd))
    # The array script, the shipped files once for every point, spec.json: as for a run.
    runfolder.write_files(paths, spec, sp.array_script, stage_json=False)
    if sp.wandb_sweep:  # the agent's side, run where each point's job runs
        shutil.copyfile(node.path(node.WANDB_AGENT), paths.shipped(node.WANDB_AGENT))
    if spec.stage:  # before the points' stage.json, which lists the parts packed
        from .. import stage, stagecache

        limits = stagecache.limits(planned.prepared.profile)
        stage.pack_all(spec.stage, limits=limits, environ=req.environ)
    _write_points(sp)
    data = {
        "sweep_id": paths.run_id,
        "exp": spec.exp,
        "cluster": spec.cluster,
        "backend": sp.backend.name,
        "sweep_dir": str(paths.run_dir),
        "submitted_at": time.time(),
        **records.as_recorded(req, sp.masked_secrets()),
        "sweep": sp.options.to_record(),
        "cwd": str(req.cwd),
        "code": code,
        "hpclaunch_version": __version__,
        "kind": "wandb" if sp.wandb_sweep else "optuna" if sp.space else "grid",
        **sp.backend.site_facts(),  # which sacct answers here: no call spent finding out
        "wandb_sweep": sp.wandb_sweep,
        "arrays": [],
        "space": [dict(p.__dict__) for p in sp.space],
        "points": [
            {"index": p.index, "params": dict(p.params), "args": list(p.args), "source": p.source}
            for p in sp.points
        ],
    }
    record.write(paths.run_dir, data)
    return data


def _write_points(sp: SweepPlan) -> None:
    """A folder per point: job.sh (the template, numbered), params.env, logs/."""
    spec, sweep_id, total = sp.planned.spec, sp.paths.run_id, len(sp.points)
    template = script.point_paths(sp.paths, sp.token)  # the token where the number goes
    stage_json = render.stage_json(spec, template)
    (sp.paths.run_dir / record.POINTS).mkdir(exist_ok=True)
    # Plain strings from the template's paths: pathlib per point (three paths, five
    # joins) was a sixth of a 1,000-point submission.
    run_dir, checkpoints = str(template.run_dir), str(template.checkpoint_dir)
    inside = template.checkpoint_dir.parent == template.run_dir
    for point in sp.points:
        index = str(point.index)
        folder = run_dir.replace(sp.token, index)
        # Three mkdirs a point: logs/ with parents=True first fails (no point folder
        # yet) and costs a fourth plus a Python exception, a 1,000-point sweep's 1,000.
        os.mkdir(folder)
        os.mkdir(f"{folder}/logs")
        if inside:
            os.mkdir(checkpoints.replace(sp.token, index))
        else:  # --checkpoint-root elsewhere: <root>/<exp>/<sweep-id>/points/<i>/checkpoints
            os.makedirs(checkpoints.replace(sp.token, index), exist_ok=True)
        text = script.point_script(sp.point_template, sp.token, point.index)
        record.write_new(f"{folder}/job.sh", text)
        if not sp.space:  # an Optuna point writes its own when it asks
            env_text = script.params_env(sweep_id, total, point)
            record.write_new(f"{folder}/{record.PARAMS_ENV}", env_text)
        if spec.stage or spec.stage_out:
            stage_json["run_dir"] = folder
            records.write_json(Path(folder, node.STAGE_JSON), stage_json)


def point_record(
    sp: SweepPlan, point: Point, backend: str, job: Optional[str], **facts: Any
) -> records.RunRecord:
    """A point's run.json: a run record like any other (status/logs/show SWEEP:I)."""
    spec, paths = sp.planned.spec, script.point_paths(sp.paths, str(point.index))
    return records.new_record(
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


def write_point_records(sp: SweepPlan, data: dict[str, Any], job_ids: Sequence[str]) -> None:
    """Every point's run.json, with its array task's id ("123_4") once queued, and what
    the backend keeps of the site (which sacct answers; who runs local points)."""
    task_of = {pt: f"{j}_{pt - p.offset}" for p, j in zip(sp.parts, job_ids) for pt in p.points()}
    facts = sp.backend.site_facts()
    for point in sp.points:
        entry = point_record(sp, point, data["backend"], task_of.get(point.index), **facts)
        records.write_new(entry, fresh_folder=True)
