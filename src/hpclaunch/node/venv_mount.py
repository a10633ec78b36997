"""A packed venv (`hpclaunch env pack`) mounted on this node, for the job's ranks.

Started once per node beside the ranks (srun --overlap) when the job has no container
or a Charliecloud one (which binds the mounted path): mounts the SquashFS image at the
venv's original path with squashfuse (https://github.com/vasi/squashfuse), so that the
ranks read one file on the shared file system instead of the venv's thousands. Writes
READY<node>.<job>.<restart> (or FAILED...) into the markers folder, stays until the batch
script ends the step (srun forwards SIGUSR1; SIGTERM on scancel or the time limit) and
unmounts. The mount point is left in place: another node may still be using its own
mount of the same shared path.

Standard library only, never an import of hpclaunch; Python >= 3.6 (the nodes' python3).
Usage: python3 -I -S venv_mount.py IMAGE MOUNT_POINT MARKERS_FOLDER [BROADCAST_MAP]
(the map: this node's copy of IMAGE sent by sbcast, node/stage_bcast.py, mounted instead)
"""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from typing import List

READY, FAILED = "ready-", "failed-"
WAIT_S = 60.0  # for the mount to appear


def _tag() -> str:
    env = os.environ
    node = env.get("SLURMD_NODENAME") or os.uname()[1]
    return f"{node}.{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_RESTART_COUNT', '0')}"


def _mark(folder: str, prefix: str, text: str = "") -> None:
    path = os.path.join(folder, prefix + _tag())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _fail(folder: str, text: str) -> int:
    sys.stderr.write(f"hpclaunch: packed venv: {text}\n")
    _mark(folder, FAILED, text)
    return 1


def _unmount(child: "subprocess.Popen[bytes]", mount: str) -> None:
    """squashfuse unmounts on SIGTERM (libfuse's handlers); else fusermount or umount."""
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
    if os.path.ismount(mount):
        for argv in (["fusermount3", "-u", mount], ["fusermount", "-u", mount], ["umount", mount]):
            if shutil.which(argv[0]):
                subprocess.call(argv, stderr=subprocess.DEVNULL)
                if not os.path.ismount(mount):
                    break


def broadcast_copy(image: str, sent: str) -> str:
    """This node's copy of the image sent by sbcast (stage_bcast.py's map), or ''."""
    try:
        with open(sent) as handle:
            copy = json.load(handle).get(image) or ""
        info = os.lstat(copy)
    except (OSError, ValueError, AttributeError):
        return ""
    return copy if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() else ""


def drop_partial(sent: str) -> None:
    """A refused sbcast's partial copy (the map's "" entry) that this node may hold."""
    partial = broadcast_copy("", sent)
    try:
        if partial:
            os.unlink(partial)
    except OSError:
        pass  # the stage guard removed it first


def main(argv: List[str]) -> int:
    image, mount, folder = argv[:3]
    os.makedirs(folder, 0o700, exist_ok=True)
    copy = broadcast_copy(image, argv[3]) if len(argv) > 3 else ""
    tool = shutil.which("squashfuse")
    if not tool:
        return _fail(folder, f"squashfuse not found on {_tag()} (a packed venv needs it)")
    try:
        os.makedirs(mount, exist_ok=True)
    except OSError as exc:
        return _fail(folder, f"cannot make the mount point {mount}: {exc.strerror}")
    stop: List[int] = []
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, lambda num, frame: stop.append(num))
    # Its own session: the signals srun forwards to the task (SIGUSR1 would kill it
    # outright, leaving a dead mount) reach this script, which unmounts in order.
    child = subprocess.Popen(
        [tool, "-f", copy or image, mount], stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + WAIT_S
    while not os.path.ismount(mount):
        if child.poll() is not None or time.monotonic() > deadline or stop:
            _unmount(child, mount)
            why = child.stderr.read().decode("utf-8", "replace").strip() if child.stderr else ""
            return _fail(folder, f"squashfuse {image} {mount} failed: {why or 'no mount'}")
        time.sleep(0.05)
    if copy:
        os.unlink(copy)  # squashfuse holds it open: nothing is left on the node after it
    if len(argv) > 3:
        drop_partial(argv[3])
    _mark(folder, READY)
    while not stop and child.poll() is None:
        time.sleep(0.2)
    _unmount(child, mount)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
