"""`sweep --pack --stage`: the data staged once per node for every point of the pack. The
pack's batch script runs the same broadcast and stage guard as a plain run's
(script/broadcast.py, script/render.stage_lines) before the node agents' step, and ends
the guards after it; every point sees each item at HPCLAUNCH_DATA_<NAME> (HPCLAUNCH_DATA
for one), the path inside the node's staged folder, which the node agent learns from the
guard's record (node/pack_agent.py) and puts in place of STAGED.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import replace

from hpclaunch import node
from hpclaunch.basics import shell
from hpclaunch.basics.shell import Join, Var
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profiles import Profile
from hpclaunch.errors import HpclaunchError, UserError
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import broadcast, render

# Where a point's data variables name the node's staged folder until the node agent
# knows it (it is made by the guard on that node, at a name nobody can guess).
STAGED = "/@hpclaunch-staged@"


def check(spec: JobSpec) -> None:
    """What --pack cannot stage yet: one line each, before anything is written."""
    if not (spec.stage or spec.stage_out):
        return
    if spec.stage_out:
        why = "--stage-out copies one node-local folder back, and a pack's points have one each"
        raise UserError("--stage-out", "with --pack is not supported", why, "Drop --pack")


def data_env(spec: JobSpec) -> dict[str, str]:
    """Each staged item's variable as the points see it, STAGED for the node's folder."""
    known = {node.HPCLAUNCH_LOCAL: STAGED}
    return {name: shell.expand(word, known) for name, word in render.data_env(spec)}


def instructions(spec: JobSpec, sweep: RunPaths) -> dict[str, str]:
    """pack.json's "staged": the placeholder and where the guards record each node's folder
    (<sweep>/nodelocal/<node>.<job id>, node/stage_guard.record_local)."""
    if not spec.stage:
        return {}
    return {"placeholder": STAGED, "records": str(sweep.run_dir / node.LOCAL_RECORDS)}


def start_lines(spec: JobSpec, profile: Profile, sweep: RunPaths, cpus: int) -> list[str]:
    """Before the agents' step: the staged files sent to every node (sbcast), the guard on
    every node, the wait until every node's data is unpacked (a plain run's lines)."""
    if not spec.stage:
        return []
    whole = replace(spec, tasks_per_node=1, cpus_per_task=cpus, launcher="srun")
    lines = broadcast.lines(whole, profile, sweep) + render.local_lines(profile, sweep)
    # Each allocation's own markers (--pack-jobs: the others' name the same nodes).
    marks = Join((f"{sweep.run_dir / node.STAGE_MARKS}/", Var("SLURM_JOB_ID")))
    lines.append(shell.export(node.HPCLAUNCH_STAGE_MARKS, marks))
    # A requeued attempt (the same job id) waits for its own guards, not the last one's.
    lines.append(f'rm -rf -- "${node.HPCLAUNCH_STAGE_MARKS}"')
    return lines + render.stage_lines(whole, profile, sweep, own_marks=True)


def end_lines(spec: JobSpec) -> list[str]:
    """After the agents' step (its code in HPCLAUNCH_RC, the script's exit after these):
    the guards remove each node's staged folder."""
    if not spec.stage:
        return []
    return [
        "# Every point is done: the guards remove the staged data (srun forwards SIGUSR1).",
        'kill -USR1 "$HPCLAUNCH_STAGE_PID" 2>/dev/null',
        'wait "$HPCLAUNCH_STAGE_PID"',
    ]


@contextlib.contextmanager
def staged_here(spec: JobSpec, sweep: RunPaths, agents_env: Mapping[str, str]) -> Iterator[None]:
    """--cluster local: the data unpacked once on this machine for every agent (each
    simulated node is this one), recorded for them as a node's guard records it, and
    removed when they are done, whatever ends them."""
    if not spec.stage:
        yield
        return
    from hpclaunch.backends.local import make_local_dir
    from hpclaunch.node import stage_guard

    with stage_guard.signals_held():  # made and known here, or not made at all
        local = make_local_dir(os.getpid())
    try:
        records = str(sweep.run_dir / node.LOCAL_RECORDS)
        stage_guard.record_local(records, stage_guard.node_name(agents_env), "0", local)
        try:
            stage_guard.prepare(render.stage_json(spec, sweep), local)
        except OSError as exc:
            raise HpclaunchError(f"staging failed: {exc}") from None
        yield
    finally:
        stage_guard.finish({}, local, "local")


__all__ = ["STAGED", "check", "data_env", "end_lines", "instructions", "staged_here", "start_lines"]
