"""The sweep folder written: sweep.json, the array script, the shipped files once, the
code snapshot, and a folder per point (job.sh numbered from the template, params.env,
run.json). Files in folders made moments ago are written plainly (record.write_new):
a sweep writes thousands of them, and sweep.json is the commit point."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from typing import Any, Optional

from .. import __version__, codeplan, discover, launching, node, profiling, records, render, rundirs
from ..secretnames import masked
from ..states import State
from . import record, script
from .plans import SweepPlan
from .points import Point


def write_sweep(req: launching.Request, sp: SweepPlan) -> dict[str, Any]:
    from ..launching import _precompile

    paths, spec, planned = sp.paths, sp.planned.spec, sp.planned
    code = codeplan.write_code(planned.code, paths, rundirs.absolute(spec.run_root, req.cwd))
    paths.job_sh.write_bytes(sp.array_script.encode("utf-8", "surrogateescape"))
    for source in node.shipped(bool(spec.stage or spec.stage_out), bool(spec.watch_interval_s)):
        shutil.copyfile(node.path(source), paths.shipped(source))
    _precompile(paths.shipped(node.BOOTSTRAP))
    profiling.ship(spec, paths)  # py-spy beside the bootstrap, where every point looks
    records.write_json(paths.run_dir / "spec.json", spec.to_record())
    if spec.stage:  # before the points' stage.json, which lists the parts packed
        from .. import stage, stagecache

        limits = stagecache.limits(planned.prepared.profile)
        stage.pack_all(spec.stage, limits=limits, environ=req.environ)
    _write_points(sp)
    data = {
        "sweep_id": paths.run_id,
        "exp": spec.exp,
        "cluster": spec.cluster,
        "backend": "local" if sp.local else "slurm",
        "sweep_dir": str(paths.run_dir),
        "submitted_at": time.time(),
        **records.as_recorded(req, sp.masked_secrets()),
        "sweep": sp.options.to_record(),
        "cwd": str(req.cwd),
        "code": code,
        "hpclaunch_version": __version__,
        "kind": "wandb" if sp.wandb_sweep else "optuna" if sp.space else "grid",
        "sacct_mode": _sacct_mode(),
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


def _sacct_mode() -> Optional[str]:
    """Which sacct answers here, from the (cached) `scontrol show config`: the job
    completion file (-c) where there is no accounting database, else the database (-X)."""
    config = discover.slurm_config()
    if not config or "AccountingStorageType" not in config:
        return None
    return "-c" if config["AccountingStorageType"].endswith("/none") else "-X"


def _write_points(sp: SweepPlan) -> None:
    """A folder per point: job.sh (the template, numbered), params.env, logs/."""
    spec, sweep_id, total = sp.planned.spec, sp.paths.run_id, len(sp.points)
    stage_json = render.stage_json(spec, script.point_paths(sp.paths, sp.token))
    for point in sp.points:
        paths = script.point_paths(sp.paths, str(point.index))
        (paths.run_dir / "logs").mkdir(parents=True)
        paths.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        text = script.point_script(sp.point_template, sp.token, point.index)
        record.write_new(paths.job_sh, text)
        if not sp.space:  # an Optuna point writes its own when it asks
            record.write_new(
                paths.run_dir / record.PARAMS_ENV, script.params_env(sweep_id, total, point)
            )
        if spec.stage or spec.stage_out:
            stage_json["run_dir"] = str(paths.run_dir)
            records.write_json(paths.run_dir / node.STAGE_JSON, stage_json)


def point_record(sp: SweepPlan, point: Point, backend: str, job: Optional[str]) -> dict[str, Any]:
    """A point's run.json: a run record like any other (status/logs/show SWEEP:I)."""
    spec, paths = sp.planned.spec, script.point_paths(sp.paths, str(point.index))
    return {
        "run_id": f"{sp.paths.run_id}:{point.index}",
        "sweep_id": sp.paths.run_id,
        "point": point.index,
        "exp": spec.exp,
        "cluster": spec.cluster,
        "backend": backend,
        "run_dir": str(paths.run_dir),
        "checkpoint_dir": str(paths.checkpoint_dir),
        "job_id": job,
        "job_ids": [job] if job else [],
        "submitted_at": time.time(),
        "attempts": 1,
        "state": State.PENDING.value,
        "exit_code": None,
        "command": masked([*spec.program, *point.args], sp.masked_secrets()),
        "params": dict(point.params),
        "nodes": spec.nodes,
        "tasks_per_node": spec.tasks_per_node,
        "launcher": spec.launcher,
        "job_name": spec.job_name,
        "hpclaunch_version": __version__,
    }


def write_point_records(sp: SweepPlan, data: dict[str, Any], job_ids: Sequence[str]) -> None:
    task_of = {pt: f"{j}_{pt - p.offset}" for p, j in zip(sp.parts, job_ids) for pt in p.points()}
    for point in sp.points:
        entry = point_record(sp, point, data["backend"], task_of.get(point.index))
        path = script.point_paths(sp.paths, str(point.index)).record
        record.write_new(path, json.dumps(entry, indent=2, sort_keys=True) + "\n")
