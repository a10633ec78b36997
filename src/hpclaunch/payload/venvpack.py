"""`hpclaunch env pack`: a venv as one SquashFS file, and what a run learns from one.

Thousands of small files read by every rank from a shared file system become one big
file (shared/LUMI.md "Containers": `-B env.sqsh:/user-software:image-src=/`; CSCS's
storage guide, https://github.com/eth-cscs/cscs-docs/blob/main/docs/guides/storage.md,
packs a venv with mksquashfs for the same reason). The image holds the venv's
tree at its root plus PACKED_RECORD, which names the venv's original path: a job mounts
the image there (Apptainer's `-B FILE:PATH:image-src=/`, else squashfuse on the node,
node/venv_mount.py), so the venv's scripts and absolute paths keep working and the
ranks' `sys.prefix` is that path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from hpclaunch.config.jobspec import Bind, ContainerJob
from hpclaunch.errors import HpclaunchError, UserError
from hpclaunch.node import VENV_RECORD
from hpclaunch.payload.images import image_kind
from hpclaunch.payload.venvs import check_record

PACKED_RECORD = "hpclaunch-packed.json"  # at the image's root: {"venv": PATH, "record": ...}
SUFFIX = ".sqsh"


def is_packed(path: str) -> bool:
    """Whether --venv names a SquashFS file (a packed venv) rather than a folder."""
    return os.path.isfile(path) and image_kind(Path(path)) == "squashfs"


def _tool(name: str, field: str) -> str:
    found = shutil.which(name)
    if not found:
        raise UserError(
            field,
            f"{name} not found",
            "squashfs-tools makes and reads packed venvs",
            "Install squashfs-tools (apt/dnf install squashfs-tools) or load its module",
        )
    return found


def compressor(mksquashfs: str) -> list[str]:
    """zstd where this mksquashfs has it (fast to unpack), else its default (gzip)."""
    try:
        done = subprocess.run(
            [mksquashfs, "-help"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    listed = (done.stdout + done.stderr).split("Compressors available", 1)[-1]
    return ["-comp", "zstd"] if "\tzstd" in listed or " zstd" in listed else []


def default_output(venv: Path) -> Path:
    return venv.with_name(venv.name + SUFFIX)


def pack(venv: Path, output: Optional[Path]) -> Path:
    """Pack VENV into OUTPUT (default VENV.sqsh beside it); returns the file written.
    Written to a temporary name beside it and renamed: a failed pack leaves nothing."""
    if not (venv / "bin" / "python").exists() and not (venv / "bin" / "python3").exists():
        raise UserError("VENV", f"{venv} is not a venv (no bin/python)", "", "Give a venv folder")
    target = output or default_output(venv)
    if target == venv or str(target).startswith(str(venv).rstrip("/") + "/"):
        raise UserError("-o", f"{target} is inside {venv}", "", "Write the image beside the venv")
    if not target.parent.is_dir():
        raise UserError("-o", f"{target.parent} does not exist", "", "Create the folder first")
    mksquashfs = _tool("mksquashfs", "env pack")
    info: dict[str, Any] = {"venv": str(venv), "record": read_json(venv / VENV_RECORD)}
    import tempfile  # not on a held sweep's path (bench/sweep_submit.py)

    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:  # no half-written image left beside the target, on a failure or a Ctrl-C
        os.close(fd)
        with tempfile.NamedTemporaryFile("w", suffix=".json") as record:
            json.dump(info, record)
            record.flush()
            # A pseudo file: the record lands at the image's root without touching the
            # venv. mksquashfs runs its command with /bin/sh; the only value in it is quoted.
            pseudo = f"{PACKED_RECORD} f 444 0 0 cat {shlex.quote(record.name)}"
            argv = [mksquashfs, str(venv), tmp, "-noappend", "-no-progress", "-quiet"]
            argv += [*compressor(mksquashfs), "-p", pseudo]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            raise HpclaunchError(f"mksquashfs failed (exit {done.returncode}): {tail[0]}")
        os.replace(tmp, target)  # mode 600 (mkstemp's): the user's jobs read it as the user
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # gone after the rename
    return target


def read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def packed_record(image: str) -> dict[str, Any]:
    """The image's PACKED_RECORD (unsquashfs -cat); refuses an image without one."""
    unsquashfs = _tool("unsquashfs", "--venv")
    try:
        done = subprocess.run(
            [unsquashfs, "-cat", image, PACKED_RECORD],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        data = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        data = None
    venv = data.get("venv") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(venv, str) or not venv.startswith("/"):
        raise UserError(
            "--venv",
            f"{image} is a SquashFS file without {PACKED_RECORD}",
            "a packed venv is made by hpclaunch env pack",
            f"Pack the venv: hpclaunch env pack VENV -o {image}",
        )
    return data


def mount_path(image: str) -> str:
    """Where a packed venv is mounted on the nodes: the path it was packed from."""
    return os.path.normpath(str(packed_record(image)["venv"]))


def check_packed(image: str, container: Optional[ContainerJob]) -> list[str]:
    """The venv guard for --venv FILE.sqsh, as for a folder: the record the venv was
    packed with names its image; a venv made for another image is refused."""
    data = packed_record(image)
    record = data.get("record") if isinstance(data.get("record"), dict) else None
    return check_record(f"{image} (packed from {data['venv']})", record, container)


# The runtimes that mount a SquashFS file themselves: Apptainer's image bind, the CSCS
# Container Engine's EDF mount with the `sqsh` flag ("${SCRATCH}/data.sqsh:/data:sqsh",
# github.com/eth-cscs/cscs-docs docs/software/container-engine/edf.md, "mounts"). Pyxis's
# --container-mounts are bind mounts only (github.com/NVIDIA/pyxis README "Usage"), like
# Charliecloud's --bind: squashfuse mounts the image on the node and the mount is bound in.
MOUNTS_ITSELF = ("apptainer", "ce")


def with_packed_venv(job: ContainerJob, image: str, mount: str) -> ContainerJob:
    """Apptainer and the CE mount the image itself (`-B FILE:PATH:image-src=/`, https://
    apptainer.org/docs/user/latest/bind_paths_and_mounts.html#image-mounts; the EDF's
    `FILE:PATH:sqsh`) in place of a bind of the path; Charliecloud, Pyxis and podman-hpc
    bind PATH, which squashfuse mounted on the node (venv_mount.py)."""
    if job.runtime in MOUNTS_ITSELF:
        binds = tuple(b for b in job.binds if not (b.origin == "venv" and b.src == mount))
        packed = Bind(src=image, dst=mount, ro=True, origin="venv", image=True)
        return replace(job, binds=(*binds, packed))
    if any(b.src == mount and b.dst == mount for b in job.binds):
        return job
    # A bind of a parent folder may not carry the node's mount below it: bind the mount.
    return replace(job, binds=(*job.binds, Bind(src=mount, dst=mount, origin="venv")))


def mounts_on_nodes(job: Optional[ContainerJob], image: str) -> bool:
    """Whether each node mounts the packed venv with squashfuse (no runtime to do it)."""
    return bool(image) and (job is None or job.runtime not in MOUNTS_ITSELF)


def check_backend(job: Optional[ContainerJob], runs_here: bool) -> None:
    """The squashfuse mount is a step of the batch script: a run started without one
    (locally, or as a step of this allocation) cannot have it; Apptainer needs none."""
    if runs_here and mounts_on_nodes(job, "packed"):
        raise UserError(
            "--venv",
            "a packed venv without Apptainer is mounted by the batch job on each node",
            "this run starts its tasks here, without a batch job",
            "Give the venv folder (or unsquashfs the image), or submit the run with sbatch",
        )
