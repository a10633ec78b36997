"""The scripted readings behind the nvidia-smi and rocm-smi stand-ins in this folder.

Not a tool of its own: both stand-ins import it from beside them. There are no GPUs on
this machine or on the testbed, so the stand-ins answer the real tools' command lines
with the real tools' output formats (see each stand-in's docstring for the sources) and
take the numbers from a pattern file that a test writes.

``HPCLAUNCH_FAKE_GPU_PATTERN`` names that file, JSON::

    {
      "period_s": 1.0,
      "gpus": [GPU, ...],
      "nodes": {"node2": [GPU, ...]}
    }

``gpus`` are the GPUs of every node, unless ``nodes`` names the node (``SLURMD_NODENAME``,
else the short host name: hpclaunch's rule). A GPU::

    {"samples": [[BUSY_PCT, MEM_MIB, POWER_W], ...],
     "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "total_mib": 81559,
     "secondary": false, "power_type": "Average"}

Only ``samples`` is required. GPU *g*'s reading at sample *i* is ``samples[i % len]``, so
``[[0, 100, 90.0]] * 6 + [[97, 100, 500.0]] * 4`` is a GPU idle 60% of the time. A value
may be ``null`` (the tool has no reading: ``[N/A]`` for nvidia-smi; for rocm-smi the key
is left out, as rocm_smi.py does) or, for nvidia-smi, a string printed as it is (e.g.
``"[Not Supported]"``). ``secondary``: an MI250X secondary die, whose power rocm-smi
prints as ``N/A (Secondary die)``. ``power_type``: rocm-smi's ``Average`` (MI250X,
default) or ``Current Socket`` (MI300).

The sample index *i*: for ``nvidia-smi -l/-lms`` the loop's iteration (0, 1, ...); for a
one-shot call (rocm-smi always: it has no loop) a counter in
``$HPCLAUNCH_FAKE_GPU_STATE/<tool>-<node>.count`` (read and incremented under ``flock``)
when that folder is set, else ``int(time.time() / period_s)`` (default 1 s).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from typing import Any, NoReturn

PATTERN = "HPCLAUNCH_FAKE_GPU_PATTERN"
STATE = "HPCLAUNCH_FAKE_GPU_STATE"


def refuse(tool: str, text: str, code: int = 2) -> NoReturn:
    """What the real tool would do differently, or does not apply here: said as the
    stand-in, never as the tool."""
    sys.stderr.write(f"{tool} (hpclaunch stand-in, tests/doubles/gpu): {text}\n")
    sys.exit(code)


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def gpus(tool: str) -> list[dict[str, Any]]:
    """This node's GPUs from the pattern file."""
    path = os.environ.get(PATTERN)
    if not path:
        refuse(tool, f"{PATTERN} is not set (it names the scripted readings)", 1)
    try:
        with open(path) as handle:
            pattern = json.load(handle)
    except (OSError, ValueError) as exc:
        refuse(tool, f"cannot read {PATTERN}={path}: {exc}", 1)
    found = pattern.get("nodes", {}).get(node_name(), pattern.get("gpus", []))
    if not isinstance(found, list) or not all(g.get("samples") for g in found):
        refuse(tool, f"{path}: every GPU needs a non-empty samples list", 1)
    return found


def period(tool: str) -> float:
    path = os.environ.get(PATTERN, "")
    try:
        with open(path) as handle:
            return float(json.load(handle).get("period_s", 1.0))
    except (OSError, ValueError):
        return 1.0


def one_shot_index(tool: str) -> int:
    """The sample index of a one-shot call (see the module docstring)."""
    state = os.environ.get(STATE)
    if not state:
        return int(time.time() / period(tool))
    os.makedirs(state, exist_ok=True)
    path = os.path.join(state, f"{tool}-{node_name()}.count")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.read(fd, 64).decode().strip()
        index = int(text) if text.isdigit() else 0
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(index + 1).encode())
        return index
    finally:
        os.close(fd)


def reading(gpu: dict[str, Any], index: int) -> list[Any]:
    """[busy, mem_mib, power_w] of one GPU at sample `index`."""
    samples = gpu["samples"]
    return list(samples[index % len(samples)])
