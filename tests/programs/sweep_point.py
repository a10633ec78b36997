"""One sweep point's rank: writes <out>/p<POINT>-a<ATTEMPT>-r<RANK>.json (its argv, the
sweep variables, start and end times), rank 0 its result, then behaves as asked.

Usage: sweep_point.py OUT [--sleep S] [--sleep-if K] [--fail-point I:CODE] [--gloo]
                       [--quadratic] ARGS...
--fail-point I:CODE: point I exits CODE on its first attempt (a marker file remembers).
--sleep-if K: when K is "2", the point's first attempt sleeps 300 s (to be cancelled).
--quadratic: the result is {"loss": (x - 2) ** 2} with x from HPCLAUNCH_PARAM_X.
"""

import json
import os
import sys
import time

start = time.time()
out = sys.argv[1]
args = sys.argv[2:]
sleep, fail, gloo, quadratic, rest, sleep_if = 0.0, None, False, False, [], ""
i = 0
while i < len(args):
    if args[i] == "--sleep":
        sleep, i = float(args[i + 1]), i + 2
    elif args[i] == "--sleep-if":
        sleep_if, i = args[i + 1], i + 2
    elif args[i] == "--fail-point":
        fail, i = args[i + 1], i + 2
    elif args[i] == "--gloo":
        gloo, i = True, i + 1
    elif args[i] == "--quadratic":
        quadratic, i = True, i + 1
    else:
        rest.append(args[i])
        i += 1
point = os.environ.get("HPCLAUNCH_POINT", "x")
rank = os.environ.get("RANK", "x")
marker = os.path.join(out, f"failed-once-{point}")
attempt = 2 if os.path.exists(marker) else 1  # before any rank of this attempt fails
total = None
if gloo:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    total = t.item()
    dist.destroy_process_group()
slept = os.path.join(out, f"slept-{point}")
if sleep_if == "2" and not os.path.exists(slept):
    open(slept, "w").close()
    sleep = 300.0
time.sleep(sleep)
env = {
    k: v
    for k, v in os.environ.items()
    if k.startswith("HPCLAUNCH_PARAM")
    or k
    in (
        "HPCLAUNCH_SWEEP_ID",
        "HPCLAUNCH_POINT",
        "HPCLAUNCH_POINTS",
        "HPCLAUNCH_RESULT_FILE",
        "WORLD_SIZE",
        "SLURMD_NODENAME",
    )
}
record = {
    "argv": [os.fsencode(a).hex() for a in rest],
    "env": env,
    "start": start,
    "end": time.time(),
    "sum": total,
}
with open(os.path.join(out, f"p{point}-a{attempt}-r{rank}.json"), "w") as fh:
    json.dump(record, fh)
if rank == "0":
    result = {"end": time.time()}
    if quadratic:
        result["loss"] = (float(os.environ["HPCLAUNCH_PARAM_X"]) - 2.0) ** 2
    with open(os.environ["HPCLAUNCH_RESULT_FILE"], "w") as fh:
        json.dump(result, fh)
if fail and fail.split(":")[0] == point and not os.path.exists(marker):
    open(marker, "w").close()
    time.sleep(1.0)  # the other ranks write their records before the step ends them
    sys.exit(int(fail.split(":")[1]))
