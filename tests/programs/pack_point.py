"""A packed sweep point's rank: writes <out>/p<POINT>-r<RANK>-t<TRY>.json with what it saw
(its rank contract, GPUs, cores, start and end), then behaves as asked.

Usage: pack_point.py OUT SLEEP [fail-once | fail | hang]
"""

import json
import os
import sys
import time


def _read(path: str) -> "str | None":
    return open(path).read() if os.path.isfile(path) else None


start = time.time()
out, sleep = sys.argv[1], float(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else ""
point = os.environ.get("HPCLAUNCH_POINT", "x")
rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID", "x")  # without the bootstrap
marker = os.path.join(out, f"tried-{point}-r{rank}")
tries = 2 if os.path.exists(marker) else 1
open(marker, "a").close()
if mode == "hang":
    sleep = 3600.0
time.sleep(sleep)
seen = {
    k: os.environ.get(k)
    for k in (
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS",
        "SLURM_PROCID", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HPCLAUNCH_POINT",
        "SLURMD_NODENAME", "OMP_NUM_THREADS", "HPCLAUNCH_LOCAL", "HPCLAUNCH_DATA",
    )
}  # fmt: skip
local = os.environ.get("HPCLAUNCH_LOCAL") or ""
record = {
    "env": seen,
    "local_is_dir": os.path.isdir(local),
    "data": _read(os.environ.get("HPCLAUNCH_DATA") or ""),  # --stage: the staged file
    "cpus": sorted(os.sched_getaffinity(0)),
    "start": start,
    "end": time.time(),
}
with open(os.path.join(out, f"p{point}-r{rank}-t{tries}.json"), "w") as fh:
    json.dump(record, fh)
if mode == "fail" or (mode == "fail-once" and tries == 1):
    sys.exit(3)
