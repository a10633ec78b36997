"""`hpclaunch image import SOURCE`: an image made once for the profile's runtime
(payload/imports.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from hpclaunch.cli import common

RUNTIMES = ("apptainer", "charliecloud", "pyxis", "ce", "podman-hpc")
IMPORT_HELP = """Make SOURCE into an image the profile's runtime runs, once, here.

\b
SOURCE is a root file system folder or a registry reference (docker://IMAGE). Pyxis,
the CSCS Container Engine and Charliecloud get a SquashFS file (enroot import, or
mksquashfs with enroot's options), Apptainer a SIF (apptainer build), podman-hpc an
image in its storage, migrated for the nodes (podman-hpc migrate). Jobs then start it
from that file: no node pulls or unpacks an image. Says where it put it and its size.

\b
Example:
  hpclaunch image import --container-runtime pyxis docker://nvcr.io#nvidia/pytorch:24.05-py3
  hpclaunch run --container-runtime pyxis --container ./pytorch-24.05-py3.sqsh -- python t.py
"""


def _human(nbytes: int) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor:
            return f"{nbytes / factor:.1f} {unit}"
    return f"{nbytes} bytes"


@click.group("image")
def image_group() -> None:
    """Container images for the profile's runtime."""


@image_group.command("import", help=IMPORT_HELP)
@click.argument("source")
@click.option("--cluster", metavar="NAME", help="Cluster profile (default as for run).")
@click.option(
    "--container-runtime", type=click.Choice(RUNTIMES), help="Runtime (default: the profile's)."
)
@click.option("-o", "--output", metavar="PATH", help="The image file (default: ./NAME.sqsh).")
@click.option("--name", metavar="NAME", help="podman-hpc: the image's name (default: SOURCE's).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: image, size, runtime.")
def import_cmd(
    source: str,
    cluster: Optional[str],
    container_runtime: Optional[str],
    output: Optional[str],
    name: Optional[str],
    as_json: bool,
) -> int:
    from hpclaunch.payload import imports
    from hpclaunch.planning import preparing

    cwd = Path.cwd()
    environ = common.environ()
    runtime = container_runtime or preparing.profile_for(cluster, cwd, environ).container.runtime
    done = imports.import_image(runtime, source, output, cwd, name)
    if as_json:
        import json

        click.echo(json.dumps({"image": done.where, "size": done.size, "runtime": runtime}))
        return 0
    size = f" ({_human(done.size)})" if done.size else " (in podman-hpc's storage)"
    click.echo(f"hpclaunch: imported {source} for {runtime}: {done.where}{size}", err=True)
    click.echo(
        f"  use it: hpclaunch run --container-runtime {runtime} --container {done.where} "
        "-- python train.py",
        err=True,
    )
    return 0
