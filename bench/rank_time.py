"""Rank timing program for bench/launch.py: one line of wall-clock stamps per rank.

Usage: python rank_time.py OUT_DIR   (OUT_DIR on a file system every node sees)

Writes OUT_DIR/r<RANK>: "<t_start> <t_import> <t_init> <world_size> <host>", where
t_start is taken before anything else runs, t_import after `import torch`, t_init after
init_process_group("gloo"). Rank variables come from env:// (torchrun, hpclaunch,
submitit's export) or, for a bare `srun` task, from SLURM_* (MASTER_ADDR/PORT must be
set by the batch script then).
"""

import time

T_START = time.time()  # first statement: "user code starts" for the benchmark

import os  # noqa: E402
import sys  # noqa: E402


def record(out_dir: str, t_start: float) -> None:
    """Import torch, join the gloo group, and write this rank's stamps (atomically)."""
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:
        os.environ.update(
            RANK=os.environ["SLURM_PROCID"],
            WORLD_SIZE=os.environ["SLURM_NTASKS"],
            LOCAL_RANK=os.environ["SLURM_LOCALID"],
        )
    import torch.distributed as dist

    t_import = time.time()
    dist.init_process_group("gloo")
    t_init = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    # Slurm's node name, not the hostname: the testbed's fallback layout runs both
    # "nodes" under one hostname.
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    line = f"{t_start!r} {t_import!r} {t_init!r} {world} {node}\n"
    tmp = os.path.join(out_dir, f".r{rank}.tmp")
    with open(tmp, "w") as f:
        f.write(line)
    os.rename(tmp, os.path.join(out_dir, f"r{rank}"))  # the harness never sees half a line
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    record(sys.argv[1], T_START)
