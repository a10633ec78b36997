"""Rank FAIL_RANK exits with FAIL_CODE after a moment; the others sleep for a long time."""

import os
import sys
import time

rank = int(os.environ["RANK"])
print(f"rank {rank} pid {os.getpid()} up", flush=True)
if rank == int(sys.argv[1]):
    time.sleep(1.0)
    sys.exit(int(sys.argv[2]))
time.sleep(300)
