"""Rank 0 writes its result where hpclaunch says; every rank prints its rank."""

import json
import os
import sys

rank = int(os.environ["RANK"])
print(f"rank {rank} of {os.environ['WORLD_SIZE']} args {sys.argv[1:]}", flush=True)
if rank == 0:
    with open(os.environ["HPCLAUNCH_RESULT_FILE"], "w") as fh:
        json.dump({"loss": 0.25, "world": int(os.environ["WORLD_SIZE"])}, fh)
