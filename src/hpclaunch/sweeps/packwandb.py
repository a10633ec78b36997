"""`sweep --pack --wandb-sweep`: one W&B agent per slot, each agent a point of the pack.
A point's rank runs node/wandb_agent.py (through the bootstrap, so the point keeps a
run's contract, logs and events, inside the container when one is given), which runs
`wandb agent --count 1 SWEEP` and, asked for the sweep's command (`hpclaunch run --
PROGRAM`), runs PROGRAM itself in the slot (HPCLAUNCH_WANDB_DIRECT): there is no batch
shell per point to hand it to. --count N points are queued, so the agents stop after N
runs of the sweep, never more at once than the slots (or --max-parallel).
"""

from __future__ import annotations

from dataclasses import replace

from hpclaunch import node
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profiles import Profile
from hpclaunch.errors import UserError
from hpclaunch.records.runpaths import RunPaths


def check(tasks_per_point: int) -> None:
    """One rank a point: only that rank's agent asks W&B for the run's parameters."""
    if tasks_per_point > 1:
        raise UserError(
            "--tasks-per-point",
            f"{tasks_per_point} with --pack and --wandb-sweep is not supported yet",
            "each point's one rank runs the W&B agent and the run",
            "Drop --tasks-per-point, or drop --pack (an array task per point)",
        )


def agent_spec(spec: JobSpec, profile: Profile, point: RunPaths, sweep_id: str) -> JobSpec:
    """The spec whose program is a point's agent: what every rank of a point runs."""
    agent = (
        profile.python, *node.PYTHON_FLAGS, str(point.shipped(node.WANDB_AGENT)), "agent",
        str(point.run_dir), "wandb", "agent", "--count", "1", sweep_id,
    )  # fmt: skip
    return replace(spec, program=agent)


def env() -> dict[str, str]:
    """What a point's agent needs beside the run's variables: run the sweep's command here."""
    return {node.HPCLAUNCH_WANDB_DIRECT: "1"}


__all__ = ["agent_spec", "check", "env"]
