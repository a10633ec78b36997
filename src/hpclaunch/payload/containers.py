"""Container jobs on the submitting side: the runtime, the image, the binds, and the
command line that starts each task inside the image.

Apptainer and Charliecloud tasks enter the container this way (Pyxis, the CSCS
Container Engine and podman-hpc pass the environment themselves: runtimes.py):

    bash -c WRAPPER hpclaunch-task  <runtime> <binds> IMAGE  [activation]  python3 bootstrap

The runtime runs with its environment cleaned (Apptainer `--cleanenv`, `ch-run
--unset-env='*'`), so the job's variables cross another way: WRAPPER opens file
descriptor 3 on a pipe that carries the task's environment (NUL-separated, never on a
command line, never in a file) and the bootstrap inside keeps the names listed in
HPCLAUNCH_CONTAINER_PASS. File descriptors survive both runtimes' exec.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Optional

from hpclaunch.basics.shell import Word
from hpclaunch.config.jobspec import Bind, ContainerJob, StageItem
from hpclaunch.config.options import RunOptions
from hpclaunch.config.profiles import ContainerSettings, Profile
from hpclaunch.errors import UserError, show
from hpclaunch.node import SQUASHFS
from hpclaunch.payload import runtimes
from hpclaunch.payload.images import SIF_MAGIC as SIF_MAGIC  # re-exported: stage, tests
from hpclaunch.payload.images import SQUASHFS_MAGIC as SQUASHFS_MAGIC
from hpclaunch.payload.images import _absolute, image_kind, runtime_image
from hpclaunch.payload.images import image_notes as image_notes
from hpclaunch.payload.images import resolve_image as resolve_image

ENV_FD = 3
# Static text (no user value in it): export the task's whole environment into fd 3, then
# become the runtime. The bootstrap filters what it reads by HPCLAUNCH_CONTAINER_PASS.
WRAPPER = (
    f'exec {ENV_FD}< <(for n in $(compgen -e); do printf "%s=%s\\0" "$n" "${{!n}}"; done)'
    ' && exec "$@"'
)
# Names that always cross: Slurm's per-task view, MPI's, hpclaunch's and the rendezvous.
ALWAYS_PASS = (
    "SLURM_*",
    "SLURMD_NODENAME",
    "PMI_*",
    "PMIX_*",
    "HPCLAUNCH_*",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "PYTHONUNBUFFERED",
    "PYTHONNOUSERSITE",
)
# Paths every runtime already shares with the host: binding into them fails (ch-run) or
# is pointless (Apptainer binds /tmp by default).
SHARED = ("/tmp", "/dev", "/proc", "/sys")


def _bad_path(field: str, path: str) -> None:
    for char, why in ((",", "a comma"), (":", "a colon")):
        if char in path:
            raise UserError(
                field,
                f"{show(path)} holds {why}",
                "bind lists separate paths with , and :",
                "Bind a parent folder without it, or rename the path",
            )


def runtime_command(runtime: str, settings: ContainerSettings) -> str:
    other = runtimes.command(runtime, settings.command)
    if other:
        return other
    if runtime == "charliecloud":
        return "ch-run"
    if settings.command:
        return settings.command
    for name in ("apptainer", "singularity"):
        if shutil.which(name):
            return name
    return "apptainer"


def parse_bind(text: str, cwd: Path, runtime: str) -> Bind:
    parts = text.split(":")
    if len(parts) > 3 or not parts[0]:
        raise UserError(
            "--bind", f"{show(text)} is not SRC[:DST[:ro]]", "", "Give e.g. --bind /data:/data:ro"
        )
    src = _absolute(parts[0], cwd)
    dst = parts[1] if len(parts) > 1 and parts[1] else src
    mode = parts[2] if len(parts) > 2 else "rw"
    if mode not in ("ro", "rw"):
        raise UserError("--bind", f"{show(text)}: mode {show(mode)}", "ro or rw", "Use :ro or :rw")
    if not dst.startswith("/"):
        raise UserError("--bind", f"destination {show(dst)} is relative", "", "Make it absolute")
    if mode == "ro" and runtime == "charliecloud":
        raise UserError(
            "--bind",
            f"{show(text)} asks for read-only",
            "ch-run (Charliecloud 0.31) binds read-write only",
            "Drop :ro, or use --container-runtime apptainer",
        )
    if not os.path.exists(src):
        raise UserError(
            "--bind", f"{src} does not exist", "on the submitting host", "Create it or fix the path"
        )
    return Bind(src=src, dst=os.path.normpath(dst), ro=mode == "ro")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def job_binds(
    settings: ContainerSettings,
    nodes: int,
    own: Iterable[tuple[str, str]],
    user: list[Bind],
    shared: tuple[str, ...] = SHARED,
) -> list[Bind]:
    """The profile's binds, hpclaunch's own folders (origin, path) and the user's, without
    a folder that an earlier one already holds at the same place or the runtime shares."""
    own = [(origin, os.path.normpath(p)) for origin, p in own if p]
    touched = [p for _, p in own] + [b.src for b in user]
    out: list[Bind] = []
    for item in settings.binds:
        if item.multi_node and nodes < 2:
            continue
        if item.when_under and not any(_under(p, r) for p in touched for r in item.when_under):
            continue
        out.append(Bind(src=item.path, dst=item.dst or item.path, ro=item.ro, origin="profile"))
    for origin, path in own:
        if any(_under(path, s) for s in shared):
            continue
        if any(b.src == b.dst and _under(path, b.src) for b in out + user):
            continue
        out = [b for b in out if not (b.origin != "profile" and _under(b.src, path))]
        out.append(Bind(src=path, dst=path, origin=origin))
    out += user
    return out


def missing_mount_points(
    image: Path, kind: str, binds: list[Bind], settings: ContainerSettings
) -> tuple[list[str], list[str]]:
    """Destinations absent from the image: (makeable, impossible). Charliecloud only."""
    node_local = {b.path for b in settings.binds if b.node_local}
    dsts = [b.dst for b in binds if b.src not in node_local]
    if kind == "directory":
        missing = [d for d in dsts if not os.path.lexists(str(image) + d)]
        writable = os.access(image, os.W_OK)
        return (missing, []) if writable else ([], missing)
    if kind == "squashfs":
        return [], squashfs_missing(image, dsts)
    return [], []


def squashfs_missing(image: Path, dsts: list[str]) -> list[str]:
    """Paths absent from a SquashFS image, by unsquashfs's listing (none when it is absent)."""
    tool = shutil.which("unsquashfs")
    if not tool or not dsts:
        return []
    try:
        done = subprocess.run(
            [tool, "-l", "-d", "", str(image), *dsts],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    listed = {line.strip().rstrip("/") for line in done.stdout.splitlines()}
    return [d for d in dsts if d.rstrip("/") not in listed]


def resolve(
    profile: Profile,
    options: RunOptions,
    environ: Mapping[str, str],
    cwd: Path,
    *,
    nodes: int,
    gpus: int,
    own: list[tuple[str, str]],
) -> Optional[ContainerJob]:
    """--container and friends -> a checked ContainerJob (None without --container)."""
    settings = profile.container
    runtime = options.container_runtime or settings.runtime
    user_binds = options.bind
    image_value = options.container or ""
    if not image_value:
        if user_binds:
            raise UserError("--bind", "given without --container", "", "Add --container IMAGE")
        return None
    runtimes.refuse_local(runtime, profile.kind)
    image = runtime_image(runtime, image_value, settings, environ, cwd)
    user = [parse_bind(b, cwd, runtime) for b in user_binds]
    for bind in user:
        _bad_path("--bind", bind.src)
        _bad_path("--bind", bind.dst)
    # Pyxis/enroot, the CE and podman give the container its own /tmp.
    shared = SHARED if runtime in runtimes.PIPED else SHARED[1:]
    binds = job_binds(settings, nodes, own, user, shared)
    for bind in binds:
        _bad_path("--container", bind.src)
    flags = list(settings.flags)
    if runtime == "apptainer" and gpus:
        flags += settings.gpu_flags
    if runtime == "podman-hpc" and gpus:  # NERSC: podman-hpc run --gpu
        # The profile's gpu_flags are its own runtime's (the slurm profile's: Apptainer's
        # --nv, which podman refuses: "unknown flag: --nv", seen on the testbed).
        profile_gpu_flags = settings.gpu_flags if settings.runtime == "podman-hpc" else ()
        flags += profile_gpu_flags or ("--gpu",)
    return ContainerJob(
        runtime=runtime,
        command=runtime_command(runtime, settings),
        image=str(image),
        binds=tuple(binds),
        flags=tuple(flags),
        activate=settings.activate,
        cwd=str(cwd),
        pass_env=settings.pass_env,
        base_environment=settings.base_environment if runtime == "ce" else (),
        annotations=tuple(settings.annotations.items()) if runtime == "ce" else (),
        broadcast_min_nodes=profile.image_broadcast_min_nodes,
    )


def check_mount_points(job: ContainerJob, settings: ContainerSettings) -> ContainerJob:
    """Charliecloud cannot make a bind's missing destination in a read-only image:
    refuse naming them; in a directory image the user may write, note them for
    make_mount_points (Apptainer makes mount points itself)."""
    if job.runtime != "charliecloud":
        return job
    image = Path(job.image)
    makeable, impossible = missing_mount_points(image, image_kind(image), list(job.binds), settings)
    if impossible:
        more = f" and {len(impossible) - 3} more" if len(impossible) > 3 else ""
        raise UserError(
            "--bind",
            f"{', '.join(impossible[:3])}{more} not in the image {image}",
            "ch-run mounts it read-only and cannot make mount points",
            "Bind to a folder the image has (e.g. /mnt), make the folder in the image, "
            "or use a directory image you can write",
        )
    return replace(job, mount_points=tuple(makeable))


STAGED_IMAGES = "/hpclaunch-data"  # where Apptainer mounts --stage'd SquashFS images


def mounts_image(job: Optional[ContainerJob], item: StageItem) -> bool:
    """Apptainer mounts a staged SquashFS image itself (no unpacking on the nodes)."""
    return item.kind == SQUASHFS and job is not None and job.runtime == "apptainer"


def with_staged_images(job: ContainerJob, items: tuple[StageItem, ...]) -> ContainerJob:
    extra = tuple(
        Bind(src=i.archive, dst=f"{STAGED_IMAGES}/{i.name}", ro=True, origin="stage", image=True)
        for i in items
        if mounts_image(job, i)
    )
    return replace(job, binds=job.binds + extra) if extra else job


def make_mount_points(job: ContainerJob) -> None:
    """Before submission: the folders a writable directory image lacks (Charliecloud)."""
    for dst in job.mount_points:
        try:
            os.makedirs(job.image + dst, exist_ok=True)
        except OSError as exc:
            raise UserError(
                "--bind",
                f"cannot make {dst} in the image {job.image}: {exc.strerror}",
                "",
                "Bind to a folder the image has, or make it in the image",
            ) from None


def runtime_argv(job: ContainerJob, clean: bool = True) -> list[str]:
    """The runtime's command line up to and including what starts Python inside.
    clean=False keeps the host's environment (`env create`: pip's proxies and index)."""
    runtimes.refuse_outside_srun(job)
    if job.runtime == "pyxis":
        argv = runtimes.one_task_srun(job)
    elif job.runtime == "podman-hpc":
        argv = [str(w) for w in runtimes.podman_argv(job, list(job.pass_env), clean)]
    elif job.runtime == "charliecloud":
        argv = [job.command, *(["--unset-env=*"] if clean else []), f"--cd={job.cwd}"]
        argv += [f"--bind={b.src}:{b.dst}" for b in job.binds]
        argv += [*job.flags, job.image, "--"]
    else:
        argv = [job.command, "exec", *(["--cleanenv"] if clean else []), "--pwd", job.cwd]
        argv += job.flags
        if job.binds:
            argv += ["--bind", ",".join(b.spec() for b in job.binds)]
        argv.append(job.image)
    if job.activate:
        # Profile text (LUMI: $WITH_CONDA, defined inside the image), run by the image's bash.
        argv += ["bash", "-c", f'{job.activate} && exec "$@"', "hpclaunch-activate"]
    return argv


def env_fd(job: Optional[ContainerJob]) -> int:
    """The descriptor the task's environment crosses on (0: none, it crosses by itself)."""
    return ENV_FD if job is not None and job.runtime in runtimes.PIPED else 0


def wrap(
    job: ContainerJob, inner: list[Word], names: Iterable[str] = (), local: bool = False
) -> list[Word]:
    """One task's command line: Pyxis and the CE enter the image in srun (the command is
    the inner one); podman-hpc in front of it, passing the names pass_list gives, with
    `local` the node-local folder's parent bound in."""
    if job.runtime in runtimes.IN_SRUN:
        return list(inner)
    if job.runtime == "podman-hpc":
        passed = pass_list(job, names).split()
        extra = [runtimes.local_mount("--volume=")] if local else []
        return [*runtimes.podman_argv(job, passed, extra=extra), *inner]
    return ["bash", "-c", WRAPPER, "hpclaunch-task", *runtime_argv(job), *inner]


def pass_list(job: ContainerJob, names: Iterable[str]) -> str:
    """HPCLAUNCH_CONTAINER_PASS: what the bootstrap keeps from fd 3 (NAME or PREFIX*)."""
    seen: dict[str, None] = {}
    for name in (*ALWAYS_PASS, *job.pass_env, *names):
        prefixes = tuple(p[:-1] for p in seen if p.endswith("*"))
        if not (name.startswith(prefixes) and not name.endswith("*")):
            seen.setdefault(name, None)
    return " ".join(seen)
