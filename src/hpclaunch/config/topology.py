"""GPU -> NUMA -> cores: derive CPU-binding masks from a node's topology table.

LUMI-G (shared/LUMI.md): GCD g sits on NUMA node numa_of_gpu[g]; each NUMA node owns
`cores_per_numa` consecutive cores split in CCDs of `ccd_size` cores; the k-th GPU of a
NUMA node takes that node's k-th CCD; the first `reserved_per_ccd` cores of every CCD
are kept by the system ("low-noise mode"). Clusters whose table is not regular give
`gpu_cores` directly (e.g. read off `nvidia-smi topo -m`).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass


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


# Tools that list this machine's GPUs, and how one listed GPU's line starts.
_GPU_LISTERS = (
    (("nvidia-smi", "-L"), "GPU "),
    (("amd-smi", "list"), "GPU:"),
    (("rocm-smi", "--showid"), "GPU["),
)


def local_gpus() -> int:
    """How many GPUs this machine's nvidia-smi, amd-smi or rocm-smi lists (the first that
    lists any; rocm-smi prints several lines per GPU, counted once each); 0: none."""
    for argv, mark in _GPU_LISTERS:
        path = shutil.which(argv[0])
        if path is None:
            continue
        try:
            done = subprocess.run(
                [path, *argv[1:]], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            continue
        lines = [line for line in done.stdout.splitlines() if line.startswith(mark)]
        # rocm-smi: "GPU[0]  : Device ID: ..." and more lines of the same GPU.
        listed = {line.split(":")[0].strip() if mark == "GPU[" else line for line in lines}
        if done.returncode == 0 and listed:
            return len(listed)
    return 0
