"""`sweep --pack` from request to running points: the sweep planned as any sweep
(sweeps/submit.plan_sweep: points, spec, folder, point template), then its pack
(sweeps/packplan.py) in place of the array script; the dry-run's text; and, where the
backend runs in the foreground (--cluster local), the node agents run here, each point's
record written from its own end event when they are done.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, TextIO

from hpclaunch import launching
from hpclaunch.basics import states, units
from hpclaunch.config.secretnames import mask_text
from hpclaunch.config.topology import local_gpus
from hpclaunch.records import runrecord, sweeprecord
from hpclaunch.sweeps import packing, packplan, packstage, packwandb, script, submit
from hpclaunch.sweeps.plans import SweepOptions, SweepPlan


def pack_options(opts: SweepOptions) -> packing.PackOptions:
    point_time = units.parse_time(opts.point_time, "--point-time") if opts.point_time else None
    mem = units.parse_memory(opts.mem_per_point, "--mem-per-point") if opts.mem_per_point else None
    return packing.PackOptions(
        opts.gpus_per_point, opts.cpus_per_point, opts.tasks_per_point, opts.retries,
        point_time, opts.pack_jobs, mem,
    )  # fmt: skip


def plan_packed(req: launching.LaunchRequest, opts: SweepOptions) -> SweepPlan:
    """The sweep as a pack: the slot plan checked (every refusal before anything is
    written), the pack's batch script as the sweep's job.sh, --pack-jobs array tasks."""
    sp = submit.plan_sweep(req, opts)
    spec, profile = sp.planned.spec, sp.planned.prepared.profile
    if sp.wandb_sweep:  # each point's rank: a W&B agent that runs one run of the sweep
        packwandb.check(opts.tasks_per_point)
        point = script.point_paths(sp.paths, sp.token)
        spec = packwandb.agent_spec(spec, profile, point, sp.wandb_sweep)
    ask = [sys.executable, "-m", submit.TRIAL_MODULE] if sp.space else None
    here = local_gpus() if sp.local and not spec.gpus_per_node else 0
    pp = packplan.plan(
        spec, profile, pack_options(opts), sp.paths, sp.planned.code.cwd, sp.points, sp.token,
        ask, here, opts.max_parallel,
    )  # fmt: skip
    if sp.local:  # the points' rendezvous on this machine
        pp.instructions["master_addr"] = "127.0.0.1"
    if sp.wandb_sweep:
        pp.instructions["env"].update(packwandb.env())
    cpus = packplan.node_facts(spec, profile, here).cpus
    text = packplan.batch_script(spec, sp.paths, sp.planned.code.cwd, pp, cpus)
    parts = [] if sp.local else packplan.array_parts(pp)
    return replace(sp, array_script=text, parts=parts, pack=pp)


def describe(sp: SweepPlan) -> str:
    """--dry-run: the slot table, the pack's job script, the agent's command, the points."""
    assert sp.pack is not None
    out = [*packplan.describe(sp.pack), "", sp.array_script.rstrip("\n"), ""]
    if sp.local:
        out.append(f"# --cluster local: the node agent runs here, {len(sp.pack.slots)} slots")
    else:
        secret = {**dict(sp.planned.plan.secret_env), **dict(sp.secret_env)}
        out += script.submit_lines(sp.sbatch_argvs(), secret)
    if not sp.space:
        out += script.preview_table(sp.points)
    return mask_text("\n".join(out) + "\n", sp.masked_secrets())


def run_here(sp: SweepPlan, environ: Mapping[str, str], out: TextIO) -> int:
    """The node agent(s) on this machine (one per planned node), then every point's record
    from its end event; 0 when all completed, else the lowest-index failed point's code."""
    assert sp.pack is not None
    env = {k: v for k, v in environ.items() if not k.startswith("SLURM_")}
    env.update(sp.planned.spec.secret_env())  # as sbatch's environment gives them a job
    nodes = sorted({s.node for s in sp.pack.slots})
    with packstage.staged_here(sp.planned.spec, sp.paths, env):
        agents = [
            subprocess.Popen([*sp.pack.agent_argv, str(n)], env=env, stdin=subprocess.DEVNULL)
            for n in nodes
        ]
        try:
            for agent in agents:
                agent.wait()
        except BaseException:
            for agent in agents:
                agent.terminate()
            raise
    codes = [record_end(sp, p.index, out) for p in sp.points]
    failed = [c for c in codes if c != 0]
    return failed[0] if failed else 0


def record_end(sp: SweepPlan, index: int, out: Optional[TextIO] = None) -> int:
    """A point's run.json from its last point_end event (the agent's word)."""
    folder = sweeprecord.point_dir(sp.paths.run_dir, index)
    end = _last(folder, runrecord.JOB_END)
    changes: dict[str, Any]
    if end is None:
        cancelled = states.State.CANCELLED
        code = states.exit_code_for(cancelled.value) or 1
        changes = {"state": cancelled.value, "exit_code": code, "reason": "never started"}
    else:
        code = int(end.get("exit_code", 1))
        state = states.State.COMPLETED if code == 0 else states.State.FAILED
        if end.get("reason") == "cancelled":
            state = states.State.CANCELLED
        changes = {"state": state.value, "exit_code": code, "ended_at": end.get("time")}
        if end.get("reason"):
            changes["reason"] = str(end["reason"])
    runrecord.update(folder, **changes)
    if out is not None:
        out.write(f"point {index}: {changes['state']} (exit {code})\n")
    return code


def _last(folder: Path, kind: str) -> Optional[dict[str, Any]]:
    found = None
    for event in runrecord.event_lines(folder):
        if event.get("event") == kind:
            found = event
    return found


__all__ = ["describe", "plan_packed", "run_here"]
