"""The runtimes srun enters itself (Pyxis/enroot, the CSCS Container Engine) and the one
each rank starts (podman-hpc): their flags, the run's EDF, their image names.

Apptainer and Charliecloud clean the environment and get it through a pipe
(containers.py); these three pass the host's environment into the container by
themselves, but let the image's values win, so hpclaunch names the variables whose
host value must win:

- Pyxis (github.com/NVIDIA/pyxis, README "Usage", args.c): `srun --container-image=SQSH
  --container-mounts=SRC:DST[:ro],... --container-workdir=CWD --no-container-mount-home
  --container-env=NAME,...` ("names of environment variables to override with the host
  environment"). The image is a SquashFS file made once (`enroot import`, hpclaunch image
  import), never a registry reference that every node would pull.
- CSCS Container Engine (docs.cscs.ch/software/container-engine/edf, .../run): `srun
  --environment=EDF`, the run's EDF (TOML: image, workdir, mounts, writable,
  base_environment, [env], [annotations]) in the run folder. "${VAR}" in an EDF is the
  host's VAR ("$$" a literal $); [env] NAME = "${NAME:-}" makes the host's value win
  (an empty value unsets it, as for a name the host lacks).
- podman-hpc (docs.nersc.gov/development/containers/podman-hpc/overview): `srun ...
  podman-hpc run --rm [--gpu] -v SRC:DST[:ro] -w CWD -e NAME ... IMAGE COMMAND` per
  rank, the image migrated once (`podman-hpc migrate`). Podman's `-e NAME` takes the
  host's value, `-e 'PREFIX*'` every host variable with that prefix
  (docs.podman.io/en/latest/markdown/podman-run.1.html, --env).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Optional

from hpclaunch.basics.shell import Join, Var, Word
from hpclaunch.config.jobspec import Bind, ContainerJob
from hpclaunch.config.profilekinds import runs_here
from hpclaunch.errors import UserError, show
from hpclaunch.records.runpaths import RunPaths

PIPED = ("apptainer", "charliecloud")  # the environment crosses through fd 3
IN_SRUN = ("pyxis", "ce")  # srun's own options enter the container
EDF_NAME = "container.toml"  # the CE's EDF in the run folder
COMMANDS = {"pyxis": "srun", "ce": "srun", "podman-hpc": "podman-hpc"}
# The parent of the job's node-local folder (staging): the batch script sets it. Pyxis,
# the CE and podman give the container its own /tmp (enroot conf/mounts/10-system.fstab
# mounts a tmpfs there), so it is bound in whenever the job has a node-local folder.
LOCAL_PARENT = "HPCLAUNCH_LOCAL_PARENT"
# The node-local copy of a broadcast image file (script/imagebcast.py), which the EDF's
# image names where the image is broadcast; attach sets it to the shared file.
IMAGE_VAR = "HPCLAUNCH_IMAGE"
IMPORTED = ".sqsh"  # the SquashFS files `hpclaunch image import` makes (enroot's suffix)
# A podman image reference: [REGISTRY/]NAME[:TAG][@DIGEST], lower case (containers/image
# reference grammar); a path is not one.
PODMAN_IMAGE = re.compile(r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_.-]+)?(@sha256:[0-9a-f]{64})?")


def refuse_registry(runtime: str, value: str) -> None:
    """Pyxis and the CE can pull `REGISTRY#IMAGE` or `docker://` on every node of every
    job: hpclaunch runs an image imported once instead (pyxis issue 24, enroot issue 154)."""
    if runtime in IN_SRUN and ("#" in value or "://" in value):
        raise UserError(
            "--container",
            f"{show(value)} is a registry reference",
            f"{runtime} would pull it on every node of every job",
            f"Import it once: hpclaunch image import {value}, then give the .sqsh file",
        )


def podman_image(value: str) -> str:
    """podman-hpc runs images from its storage by name (`podman-hpc images`)."""
    if not PODMAN_IMAGE.fullmatch(value) or value.startswith(("./", "../")):
        raise UserError(
            "--container",
            f"{show(value)} is not an image name",
            "podman-hpc runs images migrated into its storage (podman-hpc images)",
            "Give NAME[:TAG]; import a directory or archive first: hpclaunch image import",
        )
    return value


def wrong_kind(runtime: str, kind: str, image: str) -> None:
    if runtime in IN_SRUN and kind != "squashfs":
        raise UserError(
            "--container",
            f"{image} is a {kind} image",
            f"{runtime} runs a SquashFS file made once (enroot import)",
            f"Make one: hpclaunch image import {image}",
        )


def refuse_local(runtime: str, kind: str) -> None:
    """Pyxis and the CE are srun's options: a local run has no srun to enter the image."""
    if runtime in IN_SRUN and runs_here(kind):
        raise UserError(
            "--container-runtime",
            f"{runtime} on a local run",
            f"{runtime} enters the image through srun's options",
            "Run on a Slurm cluster (--cluster), or give --container-runtime podman-hpc",
        )


def refuse_outside_srun(job: ContainerJob) -> None:
    """`env create` starts the image from the login node: Pyxis through a one-task srun
    (a job of its own), the CE not yet (its EDF would need a file of its own)."""
    if job.runtime == "ce":
        raise UserError(
            "--container-runtime",
            "ce for env create",
            "the Container Engine enters images only through srun --environment",
            "Make the venv with --container-runtime pyxis on the same .sqsh, or in a job",
        )


def one_task_srun(job: ContainerJob) -> list[str]:
    """Pyxis from the login node: one task in a job of its own, in the image."""
    flags = [str(flag) for flag in srun_flags(job, [], "")]
    return ["srun", "--nodes=1", "--ntasks=1", "--quiet", *flags]


def env_names(job: ContainerJob, names: Iterable[str]) -> list[str]:
    """The variables whose host value must win inside (Pyxis --container-env, the EDF's
    [env]): hpclaunch's and the job's own names, the profile's exact names; prefixes
    (SLURM_*) come from the host by default, as the image does not set them."""
    seen: dict[str, None] = {}
    fixed = ("SLURMD_NODENAME", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
    for name in (*fixed, *names, *job.pass_env):
        if not name.endswith("*"):
            seen.setdefault(name, None)
    return list(seen)


def edf_path(paths: RunPaths) -> Path:
    """The run's EDF, beside its shipped files (a sweep's points share the sweep's)."""
    return (paths.shipped_dir or paths.run_dir) / EDF_NAME


def _pyxis_mount(bind: Bind) -> str:
    return f"{bind.src}:{bind.dst}" + (":ro" if bind.ro else "")


def _edf_mount(bind: Bind) -> str:
    """An EDF mount: a SquashFS file (a packed venv) is mounted by the CE itself with the
    `sqsh` flag (github.com/eth-cscs/cscs-docs docs/software/container-engine/edf.md)."""
    return f"{bind.src}:{bind.dst}:sqsh" if bind.image else _pyxis_mount(bind)


def local_mount(prefix: str) -> Join:
    """PREFIX$HPCLAUNCH_LOCAL_PARENT:$HPCLAUNCH_LOCAL_PARENT, expanded by the batch shell."""
    return Join((prefix, Var(LOCAL_PARENT), ":", Var(LOCAL_PARENT)))


def srun_flags(job: ContainerJob, names: list[str], edf: str, local: bool = False) -> list[Word]:
    """What srun gets before the task's command (nothing for the other runtimes); with
    `local`, the node-local folder's parent bound in (Pyxis adds every --container-mounts)."""
    if job.runtime == "pyxis" and local:
        return [*srun_flags(job, names, edf), local_mount("--container-mounts=")]
    if job.runtime == "pyxis":
        flags = [f"--container-image={job.image}"]
        if job.binds:
            flags.append("--container-mounts=" + ",".join(_pyxis_mount(b) for b in job.binds))
        flags += [f"--container-workdir={job.cwd}", "--no-container-mount-home"]
        flags.append("--container-env=" + ",".join(env_names(job, names)))
        return [*flags, *job.flags]
    if job.runtime == "ce":
        return [f"--environment={edf}", *job.flags]
    return []


def _toml(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's; DEL must be escaped in TOML)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _literal(path: str) -> str:
    """A path in an EDF: the CE expands ${VAR} everywhere; $$ is a literal $."""
    return _toml(path.replace("$", "$$"))


def edf_text(
    job: ContainerJob,
    names: list[str],
    local: bool = False,
    per_task: Sequence[str] = (),
    image_var: str = "",
) -> str:
    """The run's EDF (docs.cscs.ch/software/container-engine/edf): no value of the
    environment in it, only references to the host's (secrets stay out of files). Names
    whose value differs per node or task (SLURMD_NODENAME, `per_task`: the GPU variables
    Slurm sets) are left to the host's environment, which the container inherits: the
    docs do not say on which side of srun an [env] reference is expanded. `image_var`: the
    image is the file that variable names (each node's copy of a broadcast image), which
    the CE expands in the image key too (edf.md "Environment variable expansion")."""
    lines = ["# Written by hpclaunch for this run's srun --environment (CSCS Container Engine)."]
    if job.base_environment:
        lines.append(f"base_environment = [{', '.join(_toml(b) for b in job.base_environment)}]")
    if image_var:
        lines.append(f"# The image: each node's copy of {_toml(job.image)} (sbcast), or that file.")
    image = _toml(f"${{{image_var}}}") if image_var else _literal(job.image)
    lines += [f"image = {image}", f"workdir = {_literal(job.cwd)}"]
    mounts = [_literal(_edf_mount(b)) for b in job.binds]
    if local:  # the CE expands ${VAR} from the host's environment
        mounts.append(_toml(f"${{{LOCAL_PARENT}}}:${{{LOCAL_PARENT}}}"))
    lines.append(f"mounts = [{', '.join(mounts)}]")
    lines += ["", "[env]"]
    skip = {"SLURMD_NODENAME", *per_task}
    wanted = [name for name in env_names(job, names) if name not in skip]
    lines += [f"{_toml(name)} = {_toml('${' + name + ':-}')}" for name in wanted]
    if job.annotations:
        lines += ["", "[annotations]"]
        lines += [f"{_toml(k)} = {_toml(v)}" for k, v in job.annotations]
    return "\n".join(lines) + "\n"


def podman_argv(
    job: ContainerJob, passed: list[str], clean: bool = True, extra: Sequence[Word] = ()
) -> list[Word]:
    """One rank's podman-hpc command up to the image; `passed` as HPCLAUNCH_CONTAINER_PASS
    lists them (NAME or PREFIX*). clean=False keeps the host's environment (env create)."""
    # The host's network (the rendezvous on MASTER_ADDR:MASTER_PORT across nodes) and PID
    # namespace (the bootstrap's recorded pid is the host's: stack, attach, the guards).
    argv: list[Word] = [job.command, "run", "--rm", "--network=host", "--pid=host", *job.flags]
    argv += [f"--volume={_pyxis_mount(b)}" for b in job.binds]
    argv += extra
    argv.append(f"--workdir={job.cwd}")
    argv += ["--env-host"] if not clean else [f"--env={name}" for name in passed]
    argv.append(job.image)
    return argv


def comment(job: ContainerJob) -> list[str]:
    """The dry-run's words for how the ranks enter the image."""
    if job.runtime == "podman-hpc":
        return [
            "",
            "# Each task runs podman-hpc run, which starts the rank inside the image; the",
            "# job's variables cross as --env NAME or --env 'PREFIX*' (the host's values).",
        ]
    if job.runtime == "pyxis":
        how = "srun's --container-* options (Pyxis/enroot) start each task inside the image;"
    else:
        how = f"srun --environment={EDF_NAME} (this run's EDF) starts each task inside it;"
    return [
        "",
        f"# {how} the host's environment",
        "# crosses by itself, the variables hpclaunch sets named so the host's value wins.",
    ]


def command(runtime: str, settings_command: str) -> Optional[str]:
    """The runtime's program for the new runtimes (None for Apptainer/Charliecloud)."""
    if runtime not in COMMANDS:
        return None
    return settings_command or COMMANDS[runtime]
