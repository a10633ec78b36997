"""Writes this rank's argv (as hex, so any byte survives) to <out-dir>/argv-<RANK>.json.

Usage: argv_dump.py OUT_DIR ARGS...  (OUT_DIR is not part of the dumped arguments)
"""

import json
import os
import sys

out_dir = sys.argv[1]
args = [os.fsencode(a).hex() for a in sys.argv[2:]]
rank = os.environ.get("RANK", "x")
record = {
    "rank": rank,
    "args": args,
    "env": {
        k: os.environ.get(k)
        for k in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "NODE_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "SLURM_PROCID",
            "SLURM_JOB_ID",
            "HPCLAUNCH_RUN_DIR",
            "PYTHONNOUSERSITE",
            "HPCLAUNCH_CHECKPOINT_DIR",
            "SLURMD_NODENAME",
            "PYTHONUNBUFFERED",
            "OMP_NUM_THREADS",
        )
    },
}
tmp = os.path.join(out_dir, f".argv-{rank}.tmp")
with open(tmp, "w") as handle:
    json.dump(record, handle)
os.replace(tmp, os.path.join(out_dir, f"argv-{rank}.json"))
