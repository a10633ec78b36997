"""`hpclaunch dev --shell`: the interactive shell of `attach`, on the session's first
node, inside the run's container (when it has one), venv and variables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hpclaunch.observe import attach
from hpclaunch.records.runrecord import RunRecord

# Lightning takes a process for one of srun's tasks when SLURM_NTASKS is set, unless the
# job's name is "bash" or "interactive" (_is_srun_used / _is_slurm_interactive_mode in
# Lightning-AI/pytorch-lightning src/lightning/fabric/plugins/environments/slurm.py), and
# would then refuse Trainer(devices=4) in a one-task step. Set by `env` in front of the
# command, after slurmstepd's own variables (it sets SLURM_JOB_NAME to the job's name).
# SLURM_OVERLAP=1 is srun's --overlap (https://slurm.schedmd.com/srun.html, input
# environment variables): a step started in the session (hpclaunch.call from a notebook
# runs one, the step backend) shares the nodes the session's holding ranks keep, instead
# of waiting for them forever.
INTERACTIVE = ("env", "SLURM_JOB_NAME=interactive", "SLURM_OVERLAP=1")


def interactive(command: Sequence[str]) -> list[str]:
    return [*INTERACTIVE, *command]


def has_container(record: RunRecord) -> bool:
    return attach.container_of(attach.load_spec(record)) is not None


def plan(
    record: RunRecord, command: Sequence[str], environ: Mapping[str, str], tty: bool
) -> attach.Plan:
    """The step: the first node, in the image when the run has one (as its tasks were)."""
    target = attach.find_target(record, None)
    inside = has_container(record)
    wanted = list(command) or attach.shell_argv(environ, in_image=inside)
    return attach.plan_attach(
        record, target, interactive(wanted), container=inside, pty=tty, environ=environ
    )


def run_shell(
    record: RunRecord, command: Sequence[str], environ: Mapping[str, str], tty: bool
) -> int:
    """The shell (or COMMAND) as a child: the session releases the allocation after it."""
    code, _, _ = attach.call(plan(record, command, environ, tty))
    return code
