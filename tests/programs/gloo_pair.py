"""init_process_group(gloo) + all_reduce, then hold the port a while so that a second job
on the same nodes overlaps; writes <out>/gloo-<RANK>.json with times and the port."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

start = time.time()
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
ready = time.time()
# Rank 0's store holds MASTER_PORT from here on: a test may start the second job now.
open(os.path.join(sys.argv[1], f"ready-{os.environ['RANK']}"), "w").close()
time.sleep(float(sys.argv[2]))
dist.barrier()
dist.destroy_process_group()
with open(os.path.join(sys.argv[1], f"gloo-{os.environ['RANK']}.json"), "w") as handle:
    json.dump(
        {
            "sum": t.item(),
            "start": start,
            "ready": ready,
            "end": time.time(),
            "port": os.environ["MASTER_PORT"],
            "addr": os.environ["MASTER_ADDR"],
            "job": os.environ["SLURM_JOB_ID"],
        },
        handle,
    )
