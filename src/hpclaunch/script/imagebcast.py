"""A container image file sent once to every node with sbcast (node/stage_bcast.py), so
that a job of N nodes reads it from the shared file system once instead of N times: the
batch script sets HPCLAUNCH_IMAGE to the node-local copy (or to the shared file where
sbcast is missing or refused) and the ranks' container command names that variable:
Apptainer's and Charliecloud's command line, Pyxis's --container-image (srun's option;
"a path to a squashfs file on the remote host filesystem", github.com/NVIDIA/pyxis
README.md and args.c), the CE's EDF `image = "${HPCLAUNCH_IMAGE}"`, exported for srun
(the CE expands ${VAR} in every EDF parameter, `image` named:
github.com/eth-cscs/cscs-docs docs/software/container-engine/edf.md "Environment
variable expansion"; the EDF written at submission stays the same file for every node
and every attempt). The copy is removed at the job's end: by each node's stage guard
with --stage (also on a failure or scancel), else by one step per node after the ranks'."""

from __future__ import annotations

from pathlib import Path

from hpclaunch import node
from hpclaunch.basics import shell
from hpclaunch.basics.shell import Join, Var, Word
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profiles import Profile
from hpclaunch.payload.runtimes import IMAGE_VAR
from hpclaunch.records.runpaths import RunPaths

VAR = IMAGE_VAR
# The runtimes that read an image file: Apptainer/Singularity (a .sif or SquashFS file)
# and Charliecloud (ch-run runs a SquashFS file through squashfuse) on the rank's command
# line, Pyxis in the ranks' srun --container-image, the CE in the run's EDF. Not
# podman-hpc, which runs images from its storage by name.
RUNTIMES = ("apptainer", "charliecloud", "pyxis", "ce")


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


def use_copy_flags(spec: JobSpec, flags: list[Word]) -> list[Word]:
    """Pyxis: the ranks' srun --container-image names $HPCLAUNCH_IMAGE, not the shared file."""
    image = image_file(spec)
    if not image or spec.container is None or spec.container.runtime != "pyxis":
        return flags
    shared = f"--container-image={image}"
    return [Join(("--container-image=", Var(VAR))) if flag == shared else flag for flag in flags]


def edf_image(spec: JobSpec) -> str:
    """The CE: the variable the EDF's image names ('' where it names the shared file)."""
    job = spec.container
    return VAR if image_file(spec) and job is not None and job.runtime == "ce" else ""


def send_args(spec: JobSpec) -> list[str]:
    """stage_bcast.py's arguments for the image: it is sent after the other files."""
    image = image_file(spec)
    return ["--container", image] if image else []


def copy_lines(spec: JobSpec) -> list[str]:
    """After stage_bcast.py printed the path to use: the shared file if it printed none."""
    image = image_file(spec)
    if not image:
        return []
    # The CE expands the EDF's ${HPCLAUNCH_IMAGE} from srun's environment.
    export = [f"export {VAR}"] if edf_image(spec) else []
    return [f'[ -n "${VAR}" ] || {VAR}={shell.quote(image)}', *export]


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
