"""`hpclaunch env create`: a venv inside a container image that never replaces the
image's own packages (torch, jax, ...)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import click

from hpclaunch.cli import common

CREATE_HELP = """Make a venv at PATH for IMAGE, with the image's Python.

\b
The venv sees the image's packages (--system-site-packages) and pins every one of
them at its exact version (PATH/hpclaunch-constraints.txt), so `-r requirements.txt`
installs beside torch/jax or fails naming the package it would have replaced.
The venv remembers its image; `hpclaunch run --container IMAGE --venv PATH` activates
it in every task and refuses it for another image. Without --container the venv is
made with the cluster's Python (the profile's `python`); when that is a venv's (one is
activated), with that venv's base interpreter, pinning only what it has (a new venv
cannot see the outer venv's packages). The first line says which interpreter was used.

\b
Example:
  hpclaunch env create --container lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif \\
      -r requirements.txt /project/project_465000000/venvs/torch
"""


@click.group("env")
def env_group() -> None:
    """Python environments for container jobs."""


@env_group.command("create", help=CREATE_HELP)
@click.option("--container", metavar="IMAGE", help="Image path, name or $SIF.")
@click.option(
    "--container-runtime",
    type=click.Choice(("apptainer", "charliecloud", "pyxis", "podman-hpc")),
    help="Runtime (default: the profile's; pyxis: in a one-task srun job).",
)
@click.option("--cluster", metavar="NAME", help="Cluster profile (default as for run).")
@click.option(
    "-r", "--requirements", metavar="FILE", help="pip requirements to install into the venv."
)
@click.option("--bind", multiple=True, metavar="SRC[:DST[:ro]]", help="Extra bind (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the venv and its image.")
@click.argument("path")
def create_cmd(
    path: str,
    container: Optional[str],
    container_runtime: Optional[str],
    cluster: Optional[str],
    requirements: Optional[str],
    bind: tuple[str, ...],
    as_json: bool,
) -> int:
    from hpclaunch.config import layering
    from hpclaunch.errors import UserError
    from hpclaunch.payload import containers, project, venvs
    from hpclaunch.planning import preparing
    from hpclaunch.records import runpaths

    cwd = Path.cwd()
    environ = common.environ()
    profile = preparing.profile_for(cluster, cwd, environ)
    venv = runpaths.absolute(path, cwd)
    req = runpaths.absolute(requirements, cwd) if requirements else None
    if req is not None and not req.is_file():
        raise UserError("--requirements", f"{req} is not a file", "", "Check the path")
    if not venv.parent.is_dir():
        raise UserError("PATH", f"{venv.parent} does not exist", "", "Create the folder first")
    own = [
        ("venv", str(venv.parent)),
        ("requirements", str(req.parent) if req else ""),
        *(("requirements", path) for path in (venvs.local_paths(req) if req else [])),
        ("project", str(project.root(cwd))),
        ("cwd", str(cwd)),
    ]
    given = {"container": container, "container_runtime": container_runtime, "bind": bind}
    job = containers.resolve(
        profile, layering.cli_options(given), environ, cwd, nodes=1, gpus=0, own=own
    )
    if job is not None:
        for line in containers.image_notes(str(container or ""), job.image):
            warning = line if line.startswith("hpclaunch:") else f"hpclaunch: warning: {line}"
            click.echo(warning, err=True)
        job = containers.check_mount_points(job, profile.container)
        containers.make_mount_points(job)
    venvs.create(venv, job, profile.python, req, out=sys.stderr)
    if as_json:
        import json

        click.echo(json.dumps({"venv": str(venv), "image": str(job.image) if job else None}))
        return 0
    where = f" for {job.image}" if job else ""
    use = f"--container {job.image} " if job else ""
    click.echo(f"hpclaunch: venv ready at {venv}{where}", err=True)
    click.echo(f"  use it: hpclaunch run {use}--venv {venv} -- python train.py", err=True)
    return 0


PACK_HELP = """Pack the venv VENV into one SquashFS file (default VENV.sqsh beside it).

\b
`hpclaunch run --venv FILE.sqsh` mounts it on the nodes at VENV's path, so its scripts
and absolute paths keep working: every rank opens one file on the shared file system
instead of thousands (docs/scale.md). Apptainer mounts it itself; without a container,
or with Charliecloud, each node mounts it with squashfuse. The venv guard holds: a
venv made for one image is refused for another. Needs squashfs-tools (mksquashfs).

\b
Example:
  hpclaunch env pack /project/project_465000000/venvs/torch
  hpclaunch run --container torch.sif --venv /project/project_465000000/venvs/torch.sqsh \\
      -- python train.py
"""


@env_group.command("pack", help=PACK_HELP)
@click.option("-o", "--output", metavar="FILE.sqsh", help="Where to write the image.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the venv and its image.")
@click.argument("venv")
def pack_cmd(venv: str, output: Optional[str], as_json: bool) -> int:
    from hpclaunch.payload import venvpack
    from hpclaunch.records import runpaths

    cwd = Path.cwd()
    folder = Path(os.path.normpath(runpaths.absolute(venv, cwd)))
    target = venvpack.pack(folder, runpaths.absolute(output, cwd) if output else None)
    if as_json:
        import json

        click.echo(json.dumps({"venv": str(folder), "image": str(target)}))
        return 0
    size = target.stat().st_size / 2**20
    click.echo(f"hpclaunch: packed {folder} into {target} ({size:.1f} MiB)", err=True)
    click.echo(f"  use it: hpclaunch run --venv {target} -- python train.py", err=True)
    return 0
