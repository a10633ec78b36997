"""`sweep --pack`: a sweep's points run in slots of whole-node allocations. What is planned
(nothing written: --dry-run shows it): the slot table (sweeps/packing.py), the pack's batch
script (one srun step per node running the node agent, node/pack_agent.py), the agent's
command and pack.json, the agent's instructions (every point's rank command with a token
where its number goes, the ranks' variables, the slots). `write` puts them and the queue
(a file per point) into the sweep folder; sweeps/packrun.py runs them here.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from hpclaunch import node
from hpclaunch.basics import shell
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profiles import Profile, gpus_on_node
from hpclaunch.errors import UserError
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.records.runrecord import RunRecord
from hpclaunch.script import render, requeue
from hpclaunch.sweeps import arrays, packcontainer, packing, packstage, script
from hpclaunch.sweeps.points import Point

PACK_DIR = "pack"  # in the sweep folder: queue/, taken/, done/ (node/pack_agent.py)
PACK_JSON = "pack.json"
AGENT = "pack_agent.py"
QUEUE, TAKEN, DONE = "queue", "taken", "done"


@dataclass(frozen=True)
class PackPlan:
    slots: tuple[packing.Slot, ...]
    instructions: dict[str, Any]  # pack.json
    agent_argv: tuple[str, ...]  # one node's agent (the srun step runs it on every node)
    jobs: int  # allocations (--pack-jobs): the array's tasks
    # The batch script's lines around the agents' step: --stage's guards (sweeps/packstage.py)
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()


def node_facts(spec: JobSpec, profile: Profile, gpus_here: int) -> packing.NodeFacts:
    """A node of the allocation: its GPUs (as asked with --gpus-per-node, else the
    partition's, else this machine's), its cores and memory, the GPUs' cores."""
    part = profile.partition(spec.partition or profile.default_partition_name())
    gpus = spec.gpus_per_node or gpus_on_node(profile, part) or gpus_here
    # The cores a job may ask: LUMI-G's 56 of 64 (a job asking 64 never runs, shared/LUMI.md)
    node = profile.node
    cpus = (part.cpus if part else None) or node.usable_cpus or node.cpus or os.cpu_count() or 1
    topo = profile.topology
    cores = tuple(tuple(c) for c in topo.cores()) if topo and topo.gpus >= gpus else ()
    memory = (part.memory_mb if part else None) or profile.node.memory_mb
    return packing.NodeFacts(gpus, cpus, cores, memory)


def plan(
    spec: JobSpec,
    profile: Profile,
    opts: packing.PackOptions,
    sweep: RunPaths,
    cwd: Path,
    points: Sequence[Point],
    token: str,
    ask: Optional[Sequence[str]],
    gpus_here: int = 0,
    max_parallel: Optional[int] = None,
) -> PackPlan:
    # A packed venv (--venv FILE.sqsh) is mounted by the batch script's own steps, which
    # the pack's script has not: its points would find no venv.
    if spec.chain > 1 or spec.venv_image:
        raise UserError(
            "--pack",
            "with --chain or a packed venv is not supported yet",
            "",
            "Drop --pack (each point is then one array task), or give the venv's folder",
        )
    packcontainer.check(spec)  # a point's ranks enter the image by their own task line
    packstage.check(spec)
    facts = node_facts(spec, profile, gpus_here)
    packing.check(opts, facts, len(points))
    planned = packing.slots(opts, facts, spec.nodes, spec.cpus_per_task)
    per_node = len(planned) // max(1, spec.nodes)
    point = script.point_paths(sweep, token)
    # A point's ranks as a run of their own (no attempts of its own: the pack is requeued).
    one_rank = replace(
        spec, nodes=1, tasks_per_node=opts.tasks_per_point, gpus_per_node=0, requeue=None
    )
    batch = render.plan_batch(one_rank, profile, point, cwd)
    # Every point gets node-local scratch of its own ($HPCLAUNCH_LOCAL, made by its first
    # rank's bootstrap, removed when its ranks end): what the profile's values name there.
    env = render.task_env_values(batch, one_rank, {node.HPCLAUNCH_LOCAL: node.LOCAL_UNSET})
    env[node.HPCLAUNCH_LOCAL] = node.LOCAL_UNSET
    env.pop("OMP_NUM_THREADS", None)  # the agent's: the slot's cores per rank
    env.update(packstage.data_env(one_rank))  # in the node's staged folder, not the point's
    for name, _ in spec.secret_env():  # never in pack.json: the job's environment has them
        env.pop(name, None)
    pack_dir = sweep.run_dir / PACK_DIR
    instructions = {
        "sweep_dir": str(sweep.run_dir),
        "pack_dir": str(pack_dir),
        "token": token,
        "point_dir": str(point.run_dir),
        "checkpoint_dir": str(point.checkpoint_dir),
        "argv": [shell.expand(w, {}) for w in batch.task_argv],
        "env": env,
        "cwd": str(cwd),
        "points": {str(p.index): _point_env(sweep.run_id, len(points), p) for p in points},
        "slots": [s.to_record() for s in planned],
        "tasks_per_point": opts.tasks_per_point,
        "retries": opts.retries,
        "point_time": opts.point_time_s,
        "mem_per_point_mb": packing.mem_per_point(opts, facts, per_node),
        "gpu_vars": list(profile.gpu_vars),
        "gpu_unset": list(profile.gpu_unset),
        "ask": list(ask) if ask else None,
        "max_parallel": max_parallel,
        "staged": packstage.instructions(spec, sweep),
    }
    agent = ("python3", *node.PYTHON_FLAGS, str(sweep.run_dir / AGENT), str(pack_dir / PACK_JSON))
    before = tuple(packstage.start_lines(spec, profile, sweep, facts.cpus))
    after = tuple(packstage.end_lines(spec))
    return PackPlan(tuple(planned), instructions, agent, opts.pack_jobs, before, after)


def _point_env(sweep_id: str, total: int, point: Point) -> list[tuple[str, str]]:
    """What the point's ranks see of the sweep (as an array task's), its number too."""
    return [*script.point_env(sweep_id, total, point), (script.HPCLAUNCH_POINT, str(point.index))]


def batch_script(spec: JobSpec, sweep: RunPaths, cwd: Path, pp: PackPlan, cpus: int) -> str:
    """The pack's batch script: one srun step, one task per node, the agent in each;
    --no-kill, so a lost node leaves the others' slots running."""
    whole = replace(spec, tasks_per_node=1, cpus_per_task=cpus, launcher="srun")
    head = render.directives(whole, sweep, cwd)
    # --no-kill on the step too: a lost node does not end it ("applies to job and step
    # allocations", https://slurm.schedmd.com/srun.html#OPT_no-kill).
    srun = [
        "srun", "--no-kill", "--kill-on-bad-exit=0", f"--nodes={spec.nodes}",
        f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1", f"--cpus-per-task={cpus}", *pp.agent_argv,
    ]  # fmt: skip
    body = [
        "#!/bin/bash",
        *head,
        shell.sbatch_line("--no-kill"),
        shell.comment(
            f"Generated by hpclaunch for sweep {sweep.run_id}: {len(pp.instructions['points'])} "
            f"points packed into {len(pp.slots)} slots of {spec.nodes} node(s); edit the "
            "command, not this file."
        ),
        *spec.setup,
        "# A new attempt (--requeue) runs only the points not yet done.",
        shell.command([*pp.agent_argv, "--requeue"]),
        *pp.before,
        "# One step for the whole pack: the node agent on every node runs its slots.",
        *_launch_lines(spec, shell.command(srun), pp.after),
    ]
    return shell.lines(body)


def _launch_lines(spec: JobSpec, srun: str, after: Sequence[str]) -> list[str]:
    """The step, then `after` (the stage guards' end); under --requeue in the background,
    the time-limit signal (B:, this shell) queueing the allocation again: its next attempt
    runs the points not yet done."""
    if not spec.requeue:
        return [srun, "HPCLAUNCH_RC=$?", *after, 'exit "$HPCLAUNCH_RC"'] if after else [srun]
    task = '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"'
    return [
        f"trap 'scontrol requeue {task}' {spec.requeue.signal}",
        f"{srun} &",
        "HPCLAUNCH_PACK_PID=$!",
        *requeue.wait_lines("HPCLAUNCH_PACK_PID"),
        *after,
        'exit "$HPCLAUNCH_RC"',
    ]


def array_parts(pp: PackPlan) -> list[arrays.ArrayPart]:
    """The allocations as one array of --pack-jobs tasks (each -N nodes)."""
    return [arrays.ArrayPart(0, tuple(range(pp.jobs)), None)]


def write(sweep: RunPaths, pp: PackPlan, spec: JobSpec) -> None:
    """pack.json, the agent beside the points, the queue: a file per point; with --stage
    the guards' stage.json (once the data is packed: it lists the parts)."""
    pack_dir = sweep.run_dir / PACK_DIR
    for name in (QUEUE, TAKEN, DONE):
        (pack_dir / name).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(node.path(node.PACK_AGENT), sweep.run_dir / AGENT)
    from hpclaunch.records import runrecord

    runrecord.write_json(pack_dir / PACK_JSON, pp.instructions)
    if spec.stage:
        runrecord.write_json(sweep.run_dir / node.STAGE_JSON, render.stage_json(spec, sweep))
    for index in pp.instructions["points"]:
        (pack_dir / QUEUE / index).touch()


def describe(pp: PackPlan) -> list[str]:
    """The --dry-run lines: the slot table and the agent's command."""
    return [
        *packing.table(pp.slots),
        f"# {pp.jobs} allocation(s); every node runs one node agent, one srun step:",
        "# " + shell.command(list(pp.agent_argv)),
        f"# each rank of a point (its number for {pp.instructions['token']}) runs:",
        "# " + shell.command(list(pp.instructions["argv"])),
    ]


def cancel_points(sweep_dir: Path, recs: Sequence[RunRecord]) -> list[str]:
    """`cancel SWEEP:I` of packed points: each ends (or leaves the queue), its slot goes on."""
    from hpclaunch.backends import packstatus

    pack_dir = sweep_dir / PACK_DIR
    return [r.run_id for r in recs if packstatus.cancel_point(r, pack_dir / QUEUE, pack_dir / DONE)]


def running_points(sweep_dir: Path) -> Callable[[Sequence[int]], set[int]]:
    """alive(indices) for Optuna's ask in a packed sweep: the points a slot took and has
    not finished (a lost node's stay taken until the pack ends: their trials stay open)."""
    pack_dir = sweep_dir / PACK_DIR

    def alive(indices: Sequence[int]) -> set[int]:
        return {
            i
            for i in indices
            if (pack_dir / TAKEN / str(i)).exists() and not (pack_dir / DONE / str(i)).exists()
        }

    return alive


def queue_again(sweep_dir: Path, points: Sequence[int]) -> None:
    """`sweep retry` of packed points: back into the queue, as never taken."""
    pack_dir = sweep_dir / PACK_DIR
    for index in map(str, points):
        for name in (TAKEN, DONE):
            (pack_dir / name / index).unlink(missing_ok=True)
        (pack_dir / QUEUE / index).touch()
