"""A toy training run for sweeps: "trains" for a few steps and writes its final loss,
which depends on --lr, --opt and --seed, to $HPCLAUNCH_RESULT_FILE (rank 0), as a real
program writes its validation metrics. Standard library only.

    hpclaunch sweep --grid lr=0.3,0.1,0.03,0.01 --grid opt=adam,sgd --repeat 3 \\
        -- python3 examples/sweep_toy.py --lr {lr} --opt {opt} --seed {seed}
"""

import argparse
import json
import math
import os
import random

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--opt", default="adam")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--steps", type=int, default=50)
args = parser.parse_args()

rng = random.Random(args.seed)
best_lr = 0.05 if args.opt == "adam" else 0.2
loss = 1.0
for _ in range(args.steps):
    # a valley around best_lr (log scale), plus the seed's noise
    loss = 0.1 + 0.5 * math.log10(args.lr / best_lr) ** 2 + 0.02 * rng.gauss(0, 1)
if os.environ.get("RANK", "0") == "0" and os.environ.get("HPCLAUNCH_RESULT_FILE"):
    with open(os.environ["HPCLAUNCH_RESULT_FILE"], "w") as fh:
        json.dump({"loss": round(loss, 6), "steps": args.steps}, fh)
print(f"lr={args.lr} opt={args.opt} seed={args.seed} loss={loss:.4f}")
