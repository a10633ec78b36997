"""The batch script's broadcast: staged files and a packed venv sent once to every node
with sbcast (node/stage_bcast.py) before the stage guards and the venv mounts start, so
that the shared file system serves one copy whatever the node count; where sbcast is
missing or refused each node reads the shared copy, as without it, with a note."""

from __future__ import annotations

from hpclaunch import node
from hpclaunch.basics import shell
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profiles import Profile
from hpclaunch.payload import containers
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import imagebcast, venvmount


def broadcasts(spec: JobSpec) -> bool:
    """Whether the nodes would read a shared file: a staged item no container mounts, or
    a packed venv each node mounts, a container image file. One node has nothing to
    share: no broadcast."""
    staged = any(not containers.mounts_image(spec.container, i) for i in spec.stage)
    image = bool(imagebcast.image_file(spec))
    return spec.nodes > 1 and (staged or venvmount.mounts_on_nodes(spec) or image)


def lines(spec: JobSpec, profile: Profile, paths: RunPaths) -> list[str]:
    if not broadcasts(spec):
        return []
    stage_json = str(paths.run_dir / node.STAGE_JSON) if spec.stage else "-"
    images = [spec.venv_image] if venvmount.mounts_on_nodes(spec) else []
    send = [
        profile.python, *node.PYTHON_FLAGS, str(paths.shipped(node.STAGE_BCAST)),
        stage_json, str(paths.run_dir / node.BROADCAST_MAP),
        *imagebcast.send_args(spec), *images,
    ]  # fmt: skip
    run = shell.command(send)
    if imagebcast.image_file(spec):  # it prints the image's path for the ranks
        run = f"{imagebcast.VAR}=$({run})"
    parent = [] if spec.stage or spec.stage_out else [
        f"{node.HPCLAUNCH_LOCAL_PARENT}={profile.local_dir}",
        f"export {node.HPCLAUNCH_LOCAL_PARENT}",
    ]  # fmt: skip
    return [
        "",
        "# Each file the nodes would read from the shared file system (staged data, the",
        "# packed venv, the container image file) is sent once to every node's local",
        "# folder with sbcast; where sbcast is missing or refused, each node reads the",
        "# shared copy (a note says so).",
        *parent,
        shell.export(node.HPCLAUNCH_STAGE_BCAST, str(paths.run_dir / node.BROADCAST_MAP)),
        run,
        *imagebcast.copy_lines(spec),
    ]
