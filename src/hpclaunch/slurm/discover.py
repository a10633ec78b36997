"""What the cluster says about itself: is Slurm here, its name, partitions and nodes.

One `scontrol show config` answers "is there a controller" and "which cluster";
one `sinfo` call gives every partition's limits and node shape. Both are cached for
the life of the process (a CLI call), never on disk: limits change.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import sys
import threading
from collections.abc import Mapping
from typing import Optional

from hpclaunch.basics.units import parse_time
from hpclaunch.config.profiles import Partition
from hpclaunch.errors import NoController
from hpclaunch.slurm import along, commands

_TIMEOUT_S = 15.0
# How long "is there a controller" may take: a dead one makes scontrol retry for ~10 s,
# and a login node's user should learn in seconds that Slurm is broken, not wait.
CONTROLLER_WAIT_S = 5.0
_SAY_AFTER_S = 1.0  # a controller that answers at once is not announced


def _run(argv: list[str]) -> Optional[str]:
    """stdout of a Slurm query, or None when the command is missing or fails."""
    return commands.query(argv, timeout=_TIMEOUT_S)


@functools.lru_cache(maxsize=1)
def slurm_config() -> Optional[dict[str, str]]:
    """`scontrol show config` as a dict, or None when no controller answers."""
    if shutil.which("sbatch") is None:
        return None
    note = f"hpclaunch: asking the Slurm controller (up to {CONTROLLER_WAIT_S:.0f} s)...\n"
    timer = threading.Timer(_SAY_AFTER_S, lambda: sys.stderr.write(note))
    timer.daemon = True
    timer.start()
    try:
        out = commands.query(["scontrol", "show", "config"], timeout=CONTROLLER_WAIT_S)
    finally:
        timer.cancel()
    if out is None:
        return None
    config: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
    return config


def ask_together() -> Optional[dict[str, str]]:
    """slurm_config(), with partitions() asked at the same time (both cached): the two
    queries wait on slurmctld together instead of one after the other. sinfo's answer
    is waited for only where scontrol's came (no controller: the caller stops). The
    queries a caller wants asked along (along.asked_along) start with them."""
    asking = threading.Thread(target=partitions, daemon=True)
    asking.start()
    along.start()
    config = slurm_config()
    if config is not None:
        asking.join()
    return config


def slurm_signs(environ: Mapping[str, str]) -> list[str]:
    """What says this machine means to use Slurm (then no answer is an error, not a local
    run): SLURM_CONF set (a missing file named), Slurm's commands on PATH."""
    signs = []
    conf = environ.get("SLURM_CONF", "")
    if conf:
        signs.append(f"SLURM_CONF={conf}" + ("" if os.path.exists(conf) else " (no such file)"))
    on_path = [cmd for cmd in ("sbatch", "scontrol") if shutil.which(cmd) is not None]
    if on_path:
        signs.append(" and ".join(on_path) + " on PATH")
    return signs


def no_controller(what: str, signs: list[str]) -> NoController:
    """The one line for "Slurm is meant here, and no controller answers"."""
    tried = f"scontrol show config, {CONTROLLER_WAIT_S:.0f} s"
    because = "; ".join(signs)
    return NoController(
        "--cluster",
        f"{what}, and no Slurm controller answers" + (f" ({because})" if because else ""),
        tried,
        "Check SLURM_CONF and that slurmctld runs, or run on this machine on purpose with "
        "--cluster local",
    )


def cluster_name() -> str:
    config = slurm_config()
    return config.get("ClusterName", "") if config else ""


def in_allocation(environ: Mapping[str, str]) -> bool:
    """True inside salloc/sbatch, where `run` starts a step instead of a new job."""
    return bool(environ.get("SLURM_JOB_ID")) and shutil.which("srun") is not None


_GRES_GPU = re.compile(r"gpu(?::[^:,()]+)?:(\d+)")


def gres_gpus(gres: str) -> int:
    """GPUs in a GRES text: "gpu:8", "gpu:mi250:8(S:0-7)", "gpu:a100:4,gpu:v100:2"."""
    return sum(int(m.group(1)) for m in _GRES_GPU.finditer(gres))


def _int(text: str) -> Optional[int]:
    text = text.strip().rstrip("+")
    return int(text) if text.isdigit() else None


_NO_TIME = ("infinite", "unlimited", "n/a")


@functools.lru_cache(maxsize=1)
def partitions() -> dict[str, Partition]:
    """Every partition with its limits; node shape = the largest node in it, so that a
    request is refused only when no node of the partition could ever hold it."""
    out = _run(["sinfo", "-h", "-o", "%P|%l|%D|%c|%G|%m|%s|%d|%L"])
    if out is None:
        return {}
    found: dict[str, dict[str, int]] = {}  # sinfo prints one row per node shape
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) != 9:
            continue
        name, limit, count, cpus, gres, mem, max_nodes, tmp_disk, default_limit = fields
        default = name.endswith("*")
        name = name.rstrip("*")
        entry = found.setdefault(
            name, {"nodes": 0, "cpus": 0, "gpus": 0, "memory_mb": 0, "default": int(default)}
        )
        entry["nodes"] += _int(count) or 0
        entry["cpus"] = max(entry["cpus"], _int(cpus) or 0)
        entry["gpus"] = max(entry["gpus"], gres_gpus(gres))
        entry["memory_mb"] = max(entry["memory_mb"], _int(mem) or 0)
        if _int(tmp_disk):  # 0 = not configured
            entry["local_disk_mb"] = max(entry.get("local_disk_mb", 0), _int(tmp_disk) or 0)
        if limit.lower() not in _NO_TIME:
            entry["max_time"] = parse_time(limit, "sinfo time limit")
        if default_limit.lower() not in _NO_TIME:  # n/a: no DefaultTime (MaxTime applies)
            entry["default_time"] = parse_time(default_limit, "sinfo default time")
        job_max = _int(max_nodes.rpartition("-")[2])  # "1-infinite", "1-4"
        if job_max:
            entry["max_nodes"] = job_max
    return {
        name: Partition.model_validate({**data, "default": bool(data["default"])})
        for name, data in found.items()
    }
