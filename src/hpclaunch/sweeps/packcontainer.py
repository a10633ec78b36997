"""`sweep --pack --container`: each point's ranks enter the run's image as a plain run's
ranks do. The node agent runs outside the image and starts each rank with the task line a
plain run's srun runs (script/containerlines.enter: the runtime's command, the run and
project binds, the variables through fd 3), planned once for a point (sweeps/packplan.py).
That works for the runtimes whose command stands in front of the rank (Apptainer,
Charliecloud); Pyxis and the CE enter the image in srun's own step, and podman-hpc binds
the node-local folder through the batch shell's variables, which a point's line has not.
"""

from __future__ import annotations

from hpclaunch.config.jobspec import JobSpec
from hpclaunch.errors import UserError
from hpclaunch.payload import runtimes

# The runtimes whose per-rank command the node agent can start for each point.
IN_FRONT = runtimes.PIPED


def check(spec: JobSpec) -> None:
    """A container --pack cannot enter yet: one line, before anything is written."""
    job = spec.container
    if job is None or job.runtime in IN_FRONT:
        return
    raise UserError(
        "--container-runtime",
        f"{job.runtime} with --pack is not supported yet",
        "a pack's points start inside the node agent's step, not as steps of their own",
        "Use --container-runtime " + " or ".join(IN_FRONT) + ", or drop --pack",
    )


__all__ = ["IN_FRONT", "check"]
