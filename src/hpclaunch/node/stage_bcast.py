"""Staged files sent once to every node with sbcast, instead of read by every node.

Run by the batch script (on the job's first node) before the stage guards start:
``python3 -I -S stage_bcast.py STAGE_JSON|- MAP_JSON [--container IMAGE] [IMAGE...]``.
Each file the guards would read from the shared file system (a staged archive, file or
SquashFS image that no container mounts, every part of a folder's pack), each IMAGE (a
packed venv) and last the --container image file (its path to use, the copy or the
shared file, printed for the batch script's $HPCLAUNCH_IMAGE) is
sent with ``sbcast -p FILE COPY`` (https://slurm.schedmd.com/sbcast.html: Slurm reads it
once and fans it out to the job's nodes through slurmd's tree) to
``$HPCLAUNCH_LOCAL_PARENT/hpclaunch-bcast-<job>.<random>.<n>`` on every node: a name
nobody can guess, and sbcast without --force refuses a file already there, so nothing
another user planted is used. MAP_JSON ({shared path: node-local copy}) tells the guards
(and node/venv_mount.py) which copies to read; each removes its node's copies once used.
Where sbcast is missing or refused, what was not sent stays out of the map and each node
reads the shared copy, as without broadcast, with one note.
``stage_bcast.py --drop MAP_JSON`` (one task per node after the ranks, where no stage
guard runs) removes this node's copies and what an earlier attempt of the same job
(--requeue) left there.

Standard library only, never an import of hpclaunch; Python >= 3.6 (the nodes' python3).
"""

import contextlib
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
from typing import Any, Dict, List

DIRECTORY, ARCHIVE, SQUASHFS, FILE = "directory", "archive", "squashfs", "file"
PREFIX = "hpclaunch-bcast-"


def shared_files(spec: Dict[str, Any]) -> List[str]:
    """What the guards read from the shared file system, in stage.json's order."""
    files = []  # type: List[str]
    for item in spec.get("items", []):
        if item["kind"] == DIRECTORY:
            files += [os.path.join(item["archive"], part[0]) for part in item.get("parts") or []]
        elif not (item["kind"] == SQUASHFS and item.get("bound")):
            files.append(item["archive"])
    return files


def broadcast(files: List[str], parent: str, sbcast: str) -> Dict[str, str]:
    """Send each file; the first refusal stops (the rest is read per node)."""
    token = "%s.%s" % (os.environ.get("SLURM_JOB_ID", "0"), secrets.token_hex(8))
    sent = {}  # type: Dict[str, str]
    for n, path in enumerate(files):
        copy = os.path.join(parent, "%s%s.%d" % (PREFIX, token, n))
        done = subprocess.run(
            [sbcast, "-p", path, copy], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        if done.returncode != 0:
            why = done.stdout.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            sys.stderr.write(
                "hpclaunch: note: sbcast of %s refused (%s): each node reads it and what "
                "follows from the shared file system\n" % (path, why[0])
            )
            sent[""] = copy  # what some nodes may hold of it: their guards remove it
            break
        sent[path] = copy
    return sent


def write_map(path: str, sent: Dict[str, str]) -> None:
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(sent, handle)
    os.rename(tmp, path)


def drop(map_path: str) -> None:
    """This node's copies in the map (this user's regular files only), the partial too,
    and what an earlier attempt of this job (--requeue keeps the job id) left here."""
    sent = {}  # type: Dict[str, str]
    try:
        with open(map_path) as handle:
            sent = json.load(handle)
    except (OSError, ValueError):
        pass
    copies = list(sent.values()) if isinstance(sent, dict) else []
    parent = os.environ.get("HPCLAUNCH_LOCAL_PARENT") or "/tmp"
    mine = "%s%s." % (PREFIX, os.environ.get("SLURM_JOB_ID", "0"))
    with contextlib.suppress(OSError):
        copies += [os.path.join(parent, n) for n in os.listdir(parent) if n.startswith(mine)]
    for copy in copies:
        try:
            info = os.lstat(copy)
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
                os.unlink(copy)
        except (OSError, TypeError):
            pass  # not on this node, or its guard removed it first


def main(argv: List[str]) -> int:
    if argv[:1] == ["--drop"]:
        drop(argv[1])
        return 0
    spec_path, map_path, images = argv[0], argv[1], argv[2:]
    container = ""
    if images[:1] == ["--container"]:
        container, images = images[1], images[2:]
    spec = {}  # type: Dict[str, Any]
    if spec_path != "-":  # "-": no --stage, only a packed venv
        with open(spec_path) as handle:
            spec = json.load(handle)
    files = shared_files(spec) + images + ([container] if container else [])
    parent = os.environ.get("HPCLAUNCH_LOCAL_PARENT") or "/tmp"
    sbcast = shutil.which("sbcast")
    sent = {}  # type: Dict[str, str]
    if not sbcast:
        sys.stderr.write("hpclaunch: note: no sbcast here: each node reads the shared copy\n")
    elif not os.path.isdir(parent):
        sys.stderr.write(
            "hpclaunch: note: no node-local folder %s: each node reads the shared copy\n" % parent
        )
    elif files:
        sent = broadcast(files, parent, sbcast)
    write_map(map_path, sent)
    if container:  # the batch script's $HPCLAUNCH_IMAGE: this node's copy or the shared file
        sys.stdout.write(sent.get(container, container) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
