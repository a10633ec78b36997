"""A container image file sent once to every node with sbcast (node/stage_bcast.py), so
that a job of N nodes reads it from the shared file system once instead of N times: the
batch script sets HPCLAUNCH_IMAGE to the node-local copy (or to the shared file where
sbcast is missing or refused) and the ranks' container command names that variable.
The copy is removed at the job's end: by each node's stage guard with --stage (also on
a failure or scancel), else by one step per node after the ranks'."""

from __future__ import annotations

from pathlib import Path

from hpclaunch import node
from hpclaunch.basics import shell
from hpclaunch.basics.shell import Var, Word
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profiles import Profile
from hpclaunch.records.runpaths import RunPaths

VAR = "HPCLAUNCH_IMAGE"
# The runtimes that name the image file on the rank's command line: Apptainer/Singularity
# (a .sif or SquashFS file), Charliecloud (ch-run runs a SquashFS file through
# squashfuse). Not (yet) Pyxis, whose --container-image=FILE.sqsh the ranks' srun line
# names; the CE names its image in the EDF, written at submission; podman-hpc runs
# images from its storage by name.
RUNTIMES = ("apptainer", "charliecloud")


def image_file(spec: JobSpec) -> str:
    """The container image each node would read from the shared file system, where it is
    a file and the job has more than one node and at least the profile's
    image_broadcast_min_nodes (below, the nodes' reads of the blocks they touch cost the
    shared file system less than sbcast's read of the whole file); '' otherwise (a
    directory image is a tree of many files: not broadcast)."""
    job = spec.container
    fewest = max(2, job.broadcast_min_nodes) if job else 2
    if job is None or spec.nodes < fewest or job.runtime not in RUNTIMES:
        return ""
    return job.image if job.image.startswith("/") and not Path(job.image).is_dir() else ""


def use_copy(spec: JobSpec, argv: list[Word]) -> list[Word]:
    """The ranks' command with the image's path replaced by $HPCLAUNCH_IMAGE."""
    image = image_file(spec)
    return [Var(VAR) if word == image else word for word in argv] if image else argv


def send_args(spec: JobSpec) -> list[str]:
    """stage_bcast.py's arguments for the image: it is sent after the other files."""
    image = image_file(spec)
    return ["--container", image] if image else []


def copy_lines(spec: JobSpec) -> list[str]:
    """After stage_bcast.py printed the path to use: the shared file if it printed none."""
    image = image_file(spec)
    if not image:
        return []
    return [f'[ -n "${VAR}" ] || {VAR}={shell.quote(image)}']


def end_lines(spec: JobSpec, profile: Profile, paths: RunPaths) -> list[str]:
    """Without stage guards: one step per node removes this node's copies."""
    if not image_file(spec) or spec.stage or spec.stage_out:
        return []
    step = [
        "srun", "--overlap", f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1", "--cpus-per-task=1", "--kill-on-bad-exit=0",
        profile.python, *node.PYTHON_FLAGS, str(paths.shipped(node.STAGE_BCAST)),
        "--drop", str(paths.run_dir / node.BROADCAST_MAP),
    ]  # fmt: skip
    return ["# The ranks are done: each node removes its copy of the image.", shell.command(step)]
