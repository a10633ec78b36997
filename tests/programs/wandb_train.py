"""A training loop that logs to W&B (offline here), as a user's program does. Writes
<out>/report-<RANK>.json: its parameters, W&B's ids, and whether the API key it was given
shows in any process's command line on this node while it runs.

Usage: wandb_train.py OUT [--lr X] [--steps N]   (W&B's agent appends --name=value too)
"""

import argparse
import json
import os

import wandb

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--steps", type=int, default=3)
args, unknown = parser.parse_known_args()
rank = int(os.environ.get("RANK", "0"))
key = os.environ.get("WANDB_API_KEY", "")
in_cmdline = False
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                in_cmdline |= bool(key) and key.encode() in fh.read()
        except OSError:
            pass
run_dir = None
if rank == 0:  # one W&B run per training run, as DDP programs do
    run = wandb.init(project="hpclaunch-test", dir=args.out, config={"lr": args.lr})
    for step in range(args.steps):
        wandb.log({"loss": args.lr / (step + 1)})
    run_dir = run.dir
    run.finish()
with open(os.path.join(os.environ.get("HPCLAUNCH_RESULT_FILE", os.devnull)), "w") as fh:
    json.dump({"loss": args.lr / args.steps}, fh)
data_dir = os.environ.get("HPCLAUNCH_DATA")
report = {
    "lr": args.lr,
    "unknown": unknown,
    "params": os.environ.get("HPCLAUNCH_PARAMS"),
    "sweep_id": os.environ.get("WANDB_SWEEP_ID"),
    "run_id": os.environ.get("WANDB_RUN_ID"),
    "key_seen": bool(key),
    "key_in_cmdline": in_cmdline,
    "run_dir": run_dir,
    "node": os.environ.get("SLURMD_NODENAME"),
    "data": sorted(os.listdir(os.environ["HPCLAUNCH_DATA"]))
    if "HPCLAUNCH_DATA" in os.environ
    else None,
}
point = os.environ.get("HPCLAUNCH_POINT")
name = f"report-p{point}-{rank}.json" if point else f"report-{rank}.json"
with open(os.path.join(args.out, name), "w") as fh:
    json.dump(report, fh)
