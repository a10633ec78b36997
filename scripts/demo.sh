#!/usr/bin/env bash
# The README's first command: set up, then run the example DDP program as 2 nodes x 2
# ranks on this machine (the local cluster: no Slurm needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
exec hpclaunch run --cluster local -N 2 --tasks-per-node 2 -- python examples/ddp_train.py --steps 30
