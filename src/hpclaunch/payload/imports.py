"""`hpclaunch image import SOURCE`: an image made once, on the login node, in the form
the profile's runtime runs, so no node of any job pulls or converts it.

- Pyxis/enroot, the CSCS CE, Charliecloud: a SquashFS file. A registry reference
  (`docker://`, `dockerd://`, `podman://`) goes through `enroot import -o OUT URI`
  (github.com/NVIDIA/enroot doc/cmd/import.md); a root file system folder through
  mksquashfs with enroot's own options (src/docker.sh: `mksquashfs rootfs FILE
  -all-root`, ENROOT_SQUASH_OPTIONS `-comp lzo -noD -exit-on-error`).
- Apptainer: `apptainer build OUT.sif SOURCE` (a folder or docker://).
- podman-hpc: `podman-hpc import` of the folder as a tar stream (or `podman-hpc pull`
  of a reference), then `podman-hpc migrate NAME`, which makes the squashed copy every
  node reads (docs.nersc.gov/development/containers/podman-hpc/overview).

Only programs are run here (no shell); what they write is private (umask 077).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpclaunch.basics import filemodes
from hpclaunch.errors import UserError, show

SCHEMES = ("docker://", "dockerd://", "podman://")
ENROOT_SQUASH_OPTIONS = ("-comp", "lzo", "-noD", "-exit-on-error")
TIMEOUT_S = 6 * 3600  # a big image on a slow file system; never unbounded


@dataclass(frozen=True)
class Imported:
    where: str  # the file made, or podman-hpc's image name
    size: int  # bytes (0 when the runtime keeps it in its own storage)
    runtime: str


def _name(source: str) -> str:
    """A file or image name from SOURCE: its last path part, tag kept as -TAG."""
    tail = source.rstrip("/").split("/")[-1].split("#")[-1] or "image"
    return re.sub(r"[^A-Za-z0-9._-]", "-", tail.replace(":", "-")).strip("-.") or "image"


def _source(source: str, cwd: Path) -> tuple[str, Optional[Path]]:
    """(the reference, None) for a registry reference, else (its path, the folder)."""
    if source.startswith(SCHEMES):
        return source, None
    folder = Path(os.path.normpath(cwd / source))
    if not folder.is_dir():
        raise UserError(
            "SOURCE",
            f"{show(source)} is not a folder or a registry reference",
            f"a root file system folder, or {', '.join(s + 'IMAGE' for s in SCHEMES)}",
            "Give the unpacked image's folder (debootstrap, ch-image, a container export)",
        )
    return str(folder), folder


def _tool(name: str, runtime: str) -> str:
    found = shutil.which(name)
    if not found:
        raise UserError(
            "image import",
            f"{name} is not on PATH",
            f"{runtime} images are made with {name} on the login node",
            f"Load the site's module that provides {name}, or run on a login node that has it",
        )
    return found


def _run(argv: list[str], stdin: Optional[int] = None) -> None:
    with filemodes.writing("private"):
        done = subprocess.run(argv, stdin=stdin, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise UserError(
            "image import",
            f"{os.path.basename(argv[0])} exited with {done.returncode}",
            "its own message is above",
            "Fix what it says and import again",
        )


def output_path(runtime: str, source: str, output: Optional[str], cwd: Path) -> Path:
    suffix = ".sif" if runtime == "apptainer" else ".sqsh"
    path = Path(os.path.normpath(cwd / output)) if output else cwd / f"{_name(source)}{suffix}"
    if path.exists():
        raise UserError(
            "--output",
            f"{path} exists",
            "an import never replaces an image a job may be reading",
            "Remove it first, or give another --output",
        )
    if not path.parent.is_dir():
        raise UserError("--output", f"{path.parent} does not exist", "", "Create the folder first")
    return path


def import_image(
    runtime: str, source: str, output: Optional[str], cwd: Path, name: Optional[str] = None
) -> Imported:
    """SOURCE made into the runtime's image, once."""
    ref, folder = _source(source, cwd)
    if runtime == "podman-hpc":
        return _podman(ref, folder, name or _name(source))
    out = output_path(runtime, source, output, cwd)
    if runtime == "apptainer":
        _run([_tool("apptainer", runtime), "build", str(out), ref])
    elif folder is None:
        if runtime == "charliecloud":
            raise UserError(
                "SOURCE",
                f"{show(source)} is a registry reference",
                "no registry is pulled for Charliecloud here",
                "Pull it with ch-image, then import the folder",
            )
        _run([_tool("enroot", runtime), "import", "--output", str(out), ref])
    else:
        squash = [_tool("mksquashfs", runtime), str(folder), str(out), "-all-root"]
        _run([*squash, "-quiet", "-no-progress", *ENROOT_SQUASH_OPTIONS])
    return Imported(str(out), out.stat().st_size, runtime)


def _podman(ref: str, folder: Optional[Path], name: str) -> Imported:
    tool = _tool("podman-hpc", "podman-hpc")
    if folder is None:
        _run([tool, "pull", ref.removeprefix("docker://")])
        name = ref.removeprefix("docker://")
    else:
        tar = subprocess.Popen(["tar", "-C", str(folder), "-c", "."], stdout=subprocess.PIPE)
        try:
            assert tar.stdout is not None
            _run([tool, "import", "-", name], stdin=tar.stdout.fileno())
        finally:
            if tar.stdout is not None:
                tar.stdout.close()
            tar.wait()
    _run([tool, "migrate", name])
    _check_migrated(tool, name)
    return Imported(name, 0, "podman-hpc")


def _check_migrated(tool: str, name: str) -> None:
    """`podman-hpc migrate` exits 0 when it fails (podman_hpc.py: `sys.exit()` after
    migrate_image, which logs "Squash Failed" and returns False): the squashed copy the
    nodes read is looked for among the read-only images (podman-images(1) --filter)."""
    wanted = name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
    argv = [tool, "images", "--filter", "readonly=true", "--format", "{{.Repository}}:{{.Tag}}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    listed = done.stdout.split()
    if not any(item == wanted or item.endswith("/" + wanted) for item in listed):
        raise UserError(
            "image import",
            f"podman-hpc migrate made no squashed copy of {name}",
            "podman-hpc images lists it with R/O false only; migrate's errors are above",
            "Fix what they say (podman-hpc infohpc shows its settings), then run "
            f"podman-hpc migrate {name}",
        )
