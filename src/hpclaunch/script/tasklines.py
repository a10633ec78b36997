"""The job's tasks as sbatch and the ranks' srun get them: per node, and with
--overcommit (more ranks than cores) Slurm's own option on both, the job asking for its
total instead (https://slurm.schedmd.com/sbatch.html#OPT_overcommit,
https://slurm.schedmd.com/srun.html#OPT_overcommit)."""

from __future__ import annotations

from hpclaunch.basics import shell
from hpclaunch.config.jobspec import JobSpec


def job_lines(spec: JobSpec) -> list[str]:
    """The #SBATCH lines of the job's tasks. With --overcommit the total: Slurm 22.05
    refuses --ntasks-per-node above a node's CPUs even with --overcommit ("Requested node
    configuration is not available") and grants --ntasks (seen on the testbed); the
    step's srun still places them --ntasks-per-node, block by block."""
    if spec.overcommit:
        return [
            shell.sbatch_line("--ntasks", str(spec.ntasks)),
            shell.sbatch_line("--overcommit"),
        ]
    return [shell.sbatch_line("--ntasks-per-node", str(spec.ntasks // spec.nodes))]


def step_flags(spec: JobSpec) -> list[str]:
    """What the ranks' srun adds: --overcommit for the step too."""
    return ["--overcommit"] if spec.overcommit else []
