"""Which image a run uses: --container's value looked up (a path, a name in the
profile's image folders, $SIF, or for podman-hpc a name in its storage), its kind, and
what --dry-run says of it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hpclaunch.basics.users import _uid_name
from hpclaunch.config.profiles import ContainerSettings
from hpclaunch.errors import UserError, show
from hpclaunch.payload import runtimes
from hpclaunch.records import runpaths

SIF_MAGIC = b"SIF_MAGIC"
SQUASHFS_MAGIC = b"hsqs"


def _absolute(path: str, cwd: Path) -> str:
    return os.path.normpath(runpaths.absolute(path, cwd))


def image_kind(path: Path) -> str:
    """directory, sif, squashfs or other (ext3, or an unknown file)."""
    if path.is_dir():
        return "directory"
    try:
        with open(path, "rb") as handle:
            head = handle.read(128)
    except OSError:
        return "other"
    if head.startswith(SQUASHFS_MAGIC):
        return "squashfs"
    if SIF_MAGIC in head:
        return "sif"
    return "other"


def resolve_image(
    value: str,
    settings: ContainerSettings,
    environ: Mapping[str, str],
    cwd: Path,
    suffix: str = ".sif",
) -> Path:
    """`$VAR` (a container module's $SIF) is read from the environment first. Then a value
    with a slash (`./NAME.sif`, `../x.sif`, `/abs/x.sif`) is that file; a bare name is
    looked up only in the profile's image folders (NAME, then NAME.sif), never in the
    current folder, where another user of a group folder could have put one."""
    if value.startswith("$"):
        name = value.strip("${}")
        if not environ.get(name):
            raise UserError(
                "--container",
                f"{value} is not set",
                f"container modules set {', '.join(settings.image_vars) or 'SIF'}",
                "Load the container module first, or give the image's path",
            )
        value = environ[name]
    if "/" in value:
        path = Path(_absolute(value, cwd))
        if path.exists():
            return path
        raise UserError(
            "--container", f"image {show(value)} not found", f"no {path}", "Give the image's path"
        )
    names = (value,) if value.endswith(suffix) else (value, f"{value}{suffix}")
    folders = [_absolute(folder, cwd) for folder in settings.image_dirs]
    for folder in folders:
        for name in names:
            if os.path.exists(os.path.join(folder, name)):
                return Path(folder, name)
    searched = ", ".join(folders) if folders else "none: the profile sets no [container] image_dirs"
    here = f"./{value}" if os.path.exists(cwd / value) else f"./{names[-1]}"
    raise UserError(
        "--container",
        f"image {show(value)} not found",
        f"a bare name is looked up only in the profile's image folders: {searched}",
        f"Write {here} for a file in the current folder, or give the image's path",
    )


def image_notes(value: str, image: str) -> list[str]:
    """What --dry-run and the start say about the image: the file used and where it was
    found; a warning when someone other than the user (or root) can change it. The site's
    images (the profile's folders, a container module's $SIF) belong to whatever account
    the site keeps them under: only their write permissions are checked."""
    origin = ""
    if not image.startswith("/"):  # podman-hpc's: a name, no folder was searched
        origin = " (a name in podman-hpc's storage)"
    elif value.startswith("$"):
        origin = f" (from {value})"
    elif "/" not in value:
        origin = f" (found in the profile's image folder {os.path.dirname(image)})"
    notes = [f"hpclaunch: container image {image}{origin}"]
    try:
        info = os.stat(image)
    except OSError:
        return notes
    problems = []
    if not origin and info.st_uid not in (0, os.getuid()):
        problems.append(f"owned by {_uid_name(info.st_uid) or info.st_uid}")
    writers = [who for who, bit in (("group", 0o020), ("others", 0o002)) if info.st_mode & bit]
    if writers:
        problems.append("writable by " + " and ".join(writers))
    if problems:
        notes.append(
            f"container image {image} is {' and '.join(problems)}: someone else can change "
            "what your job runs (use an image only you or root can write: chmod go-w, or a copy)"
        )
    return notes


def runtime_image(
    runtime: str,
    value: str,
    settings: ContainerSettings,
    environ: Mapping[str, str],
    cwd: Path,
) -> Path:
    """The image the runtime runs, checked for its kind: Pyxis and the CE a SquashFS
    file (NAME, then NAME.sqsh, in the image folders), podman-hpc a name in its storage,
    Charliecloud a directory or SquashFS image."""
    runtimes.refuse_registry(runtime, value)
    if runtime == "podman-hpc":
        return Path(runtimes.podman_image(value))
    suffix = runtimes.IMPORTED if runtime in runtimes.IN_SRUN else ".sif"
    image = resolve_image(value, settings, environ, cwd, suffix)
    kind = image_kind(image)
    runtimes.wrong_kind(runtime, kind, str(image))
    if runtime == "charliecloud" and kind not in ("directory", "squashfs"):
        raise UserError(
            "--container",
            f"{image} is a {kind} image",
            "ch-run runs directory and SquashFS images",
            "Convert it (ch-convert), or use --container-runtime apptainer",
        )
    return image
