"""GPU -> NUMA -> cores: derive CPU-binding masks from a node's topology table.

LUMI-G (shared/LUMI.md): GCD g sits on NUMA node numa_of_gpu[g]; each NUMA node owns
`cores_per_numa` consecutive cores split in CCDs of `ccd_size` cores; the k-th GPU of a
NUMA node takes that node's k-th CCD; the first `reserved_per_ccd` cores of every CCD
are kept by the system ("low-noise mode"). Clusters whose table is not regular give
`gpu_cores` directly (e.g. read off `nvidia-smi topo -m`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Topology:
    """Validated (pydantic, extra keys refused) as a field of profiles.Profile."""

    numa_of_gpu: tuple[int, ...] = ()
    cores_per_numa: int = 0
    ccd_size: int = 0
    reserved_per_ccd: int = 0
    # Explicit alternative: one core-range string per GPU, e.g. "49-55" or "0,2,4".
    gpu_cores: tuple[str, ...] = ()

    def cores(self) -> list[list[int]]:
        """The cores each GPU's task should run on, in GPU order."""
        if self.gpu_cores:
            return [parse_cpu_list(text) for text in self.gpu_cores]
        result: list[list[int]] = []
        seen_on_numa: dict[int, int] = {}
        ccds_per_numa = self.cores_per_numa // self.ccd_size
        for numa in self.numa_of_gpu:
            k = seen_on_numa.get(numa, 0)
            seen_on_numa[numa] = k + 1
            ccd = numa * ccds_per_numa + (k % ccds_per_numa)
            first = ccd * self.ccd_size
            result.append(list(range(first + self.reserved_per_ccd, first + self.ccd_size)))
        return result

    @property
    def gpus(self) -> int:
        return len(self.gpu_cores) or len(self.numa_of_gpu)


def parse_cpu_list(text: str) -> list[int]:
    """'1-7,9' -> [1..7, 9] (the Linux cpulist format)."""
    cores: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            cores.extend(range(int(lo), int(hi) + 1))
        elif part:
            cores.append(int(part))
    return cores


def mask(cores: Sequence[int], width_bits: int = 64) -> str:
    """A hex CPU mask, zero-padded to `width_bits` like the LUMI docs print them."""
    value = 0
    for core in cores:
        value |= 1 << core
    digits = max(width_bits, max(cores, default=0) + 1)
    digits = -(-digits // 64) * 16
    return f"0x{value:0{digits}x}"


def mask_cpu_bind(topology: Topology, verbose: bool = True) -> str:
    """`--cpu-bind` value: one mask per task, in local-rank order."""
    cores = topology.cores()
    width = max((max(c, default=0) for c in cores), default=0) + 1
    masks = ",".join(mask(c, max(64, width)) for c in cores)
    return f"{'verbose,' if verbose else ''}mask_cpu:{masks}"


def map_cpu_bind(topology: Topology, verbose: bool = True) -> str:
    """Single-core form: the first usable core of each GPU's set."""
    first = ",".join(str(c[0]) for c in topology.cores())
    return f"{'verbose,' if verbose else ''}map_cpu:{first}"


# The GPU tools' own listings: how this machine's GPUs are found (a local run's watch, a
# project file's gpus-per-node checked against a workstation). The first tool that runs
# and answers is the one that counts.
GPU_LISTINGS = {
    "nvidia-smi": ["-L"],  # "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)" a line
    "rocm-smi": ["--showid", "--json"],  # {"card0": {...}, ...}
    "amd-smi": ["list", "--json"],  # [{"gpu": 0, ...}, ...]
}


def local_gpus(path: Optional[str] = None) -> int:
    """The GPUs this machine's first GPU tool on `path` (default: PATH) lists
    (nvidia-smi -L, rocm-smi --showid --json, amd-smi list --json); 0 without a tool, or
    when it lists none."""
    for tool, args in GPU_LISTINGS.items():
        found = shutil.which(tool, path=path)
        if found is None:
            continue
        try:
            done = subprocess.run(
                [found, *args], capture_output=True, text=True, timeout=20, check=False
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return _listed(tool, done.stdout)
    return 0


def _listed(tool: str, out: str) -> int:
    if tool == "nvidia-smi":
        return sum(1 for line in out.splitlines() if line.startswith("GPU "))
    try:
        data = json.loads(out)
    except ValueError:
        return 0
    if isinstance(data, dict):
        return sum(1 for key in data if str(key).startswith("card"))
    return len(data) if isinstance(data, list) else 0
