"""A container's part of the job script: what each runtime adds to the ranks' srun
line and task (payload/containers.py, payload/runtimes.py), the files it reads (the
CE's EDF) and the comment that shows how a rank enters the image."""

from __future__ import annotations

from hpclaunch import node
from hpclaunch.basics import shell
from hpclaunch.basics.shell import Word
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profiles import Profile
from hpclaunch.payload import containers, runtimes
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import imagebcast

Files = tuple[tuple[str, str], ...]


def names(spec: JobSpec, profile: Profile, env: list[tuple[str, Word]]) -> list[str]:
    """The variables a container must get from the job: the tasks' own, the secrets'
    names, the GPU variables Slurm sets."""
    own = [k for k, _ in env if k != node.HPCLAUNCH_CONTAINER_PASS]
    own += [k for k, _ in spec.secret_env()]
    return [*own, *profile.gpu_vars, *profile.gpu_unset]


def enter(
    spec: JobSpec,
    profile: Profile,
    paths: RunPaths,
    argv: list[Word],
    env: list[tuple[str, Word]],
    local: bool = False,
) -> tuple[list[Word], list[Word], Files]:
    """(the task's command, srun's flags before it, the files the job reads); `local`:
    the job has a node-local folder, which Pyxis, the CE and podman-hpc must bind."""
    job = spec.container
    if job is None:
        return argv, [], ()
    passed = names(spec, profile, env)
    flags = runtimes.srun_flags(job, passed, str(runtimes.edf_path(paths)), local)
    files: Files = ()
    if job.runtime == "ce":
        per_task = [*profile.gpu_vars, *profile.gpu_unset]
        edf = runtimes.edf_text(job, passed, local, per_task, imagebcast.edf_image(spec))
        files = ((runtimes.EDF_NAME, edf),)
    # Enough nodes: the ranks run the image's node-local copy (imagebcast.py).
    flags = imagebcast.use_copy_flags(spec, flags)
    return imagebcast.use_copy(spec, containers.wrap(job, argv, passed, local)), flags, files


def container_comment(spec: JobSpec, argv: list[Word]) -> list[str]:
    """What one rank runs inside its task, readable, above the srun line."""
    job = spec.container
    assert job is not None
    image = imagebcast.image_file(spec)  # readable: the image, not $HPCLAUNCH_IMAGE
    sent = [f"# (the image: each node's copy sent by sbcast, ${imagebcast.VAR})"] if image else []
    if job.runtime not in runtimes.PIPED:
        return [*runtimes.comment(job), *sent]
    inner = argv[4:]  # after: bash -c WRAPPER hpclaunch-task
    inner = [image if word == shell.Var(imagebcast.VAR) else word for word in inner]
    return [
        "",
        shell.comment(f"Each task enters the image with {job.command} ({job.runtime}), which"),
        "# cleans the environment; the variables HPCLAUNCH_CONTAINER_PASS names reach the",
        f"# program through file descriptor {containers.ENV_FD}, a pipe (never a command line "
        "or a file).",
        "# What one rank runs, after the runtime's bash -c wrapper opened that pipe:",
        shell.comment("  " + shell.command(inner)),
        *sent,
    ]
