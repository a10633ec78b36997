"""Ranks whose number ends in 3 (3, 13, ... 73 of 80: 8 ranks) print the same error and
exit 1 once every rank is up (all 80 lines in ranks.tsv); rank 0 says hello; the others
print a line each and wait to be ended by Slurm (--kill-on-bad-exit)."""

import os
import sys
import time

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
print(f"rank {rank} up", flush=True)
if rank == 0:
    print("rank 0 says hello", flush=True)
if rank % 10 == 3:
    ranks = os.path.join(os.environ["HPCLAUNCH_LOG_DIR"], "ranks.tsv")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open(ranks) as f:
            if len(f.read().splitlines()) >= world:
                break
        time.sleep(0.1)
    print("RuntimeError: CUDA out of memory (simulated)", file=sys.stderr, flush=True)
    time.sleep(3.0)  # every failing rank prints before the first exit ends the step
    sys.exit(1)
time.sleep(120)
