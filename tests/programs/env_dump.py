"""Writes the contract's variables as seen by this rank to <out>/env-<RANK>.json."""

import json
import os
import sys

NAMES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
    "SLURMD_NODENAME",
    "HPCLAUNCH_RUN_DIR",
    "HPCLAUNCH_CHECKPOINT_DIR",
    "PYTHONNOUSERSITE",
    "PYTHONUNBUFFERED",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "TORCHELASTIC_RUN_ID",
    "HPCLAUNCH_PROJECT",
    "HPCLAUNCH_EXP",
)
data = {name: os.environ.get(name) for name in NAMES}
path = os.path.join(sys.argv[1], f"env-{os.environ['RANK']}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(data, handle)
os.replace(path + ".tmp", path)
