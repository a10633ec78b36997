#!/usr/bin/env bash
# hpclaunch's GPU paths on a machine with an NVIDIA GPU and PyTorch (CI has no GPU; the
# suite's GPU tests use the stand-ins in tests/doubles/gpu). Runs, as a user would with
# no $USER or $LOGNAME, each with its output in OUT_DIR:
#   machine.txt  nvidia-smi -L, the driver, Python, torch, CUDA and NCCL versions
#   doctor.txt   `hpclaunch doctor -N 1` on this machine (local): the GPUs the rank sees,
#                its CPUs, MASTER_ADDR:PORT and an NCCL all-reduce with its bandwidth
#   ddp.txt      examples/ddp_train.py through `hpclaunch run --wait` (NCCL, DDP)
#   watch.txt    a 20 s matrix-product program through `hpclaunch run --wait`, with the
#                GPU watch sampling the real nvidia-smi, then its GPU events and
#                `hpclaunch top --once` and `plot` of its samples (gpu-*.csv, gpu.png)
#   sweep.txt    a packed local sweep of 3 points on this machine's GPUs (sweep --pack)
#   stack.txt    `hpclaunch stack` of the running matrix-product program (py-spy on PATH)
# Usage: bash scripts/gpu_check.sh OUT_DIR   (hpclaunch from this checkout's src/)
set -uo pipefail
out=$(realpath -m "${1:?usage: gpu_check.sh OUT_DIR}")
mkdir -p "$out"
repo=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
bin=$(mktemp -d)
printf '#!/bin/sh\nexec python3 -m hpclaunch "$@"\n' >"$bin/hpclaunch"
chmod +x "$bin/hpclaunch"
export PATH="$bin:$PATH"
project=$(mktemp -d)
cp "$repo"/examples/*.py "$project"/
cd "$project" || exit 1
export XDG_DATA_HOME="$project/.data" XDG_CONFIG_HOME="$project/.config" HPCLAUNCH_CLUSTER=local

step() {  # step NAME COMMAND...: its output, exit code and seconds added to OUT/NAME.txt
    local name=$1 started=$SECONDS rc
    shift
    echo "== $*" >>"$out/$name.txt"
    env -u USER -u LOGNAME "$@" >>"$out/$name.txt" 2>&1
    rc=$?
    echo "== exit $rc in $((SECONDS - started)) s" | tee -a "$out/$name.txt"
}

{
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch",
        torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
} >"$out/machine.txt" 2>&1

step doctor hpclaunch doctor -N 1 --tasks-per-node 1
step ddp hpclaunch run -N 1 --tasks-per-node 1 --gpus-per-node 1 --wait -- python3 ddp_train.py

cat >busy.py <<'EOF'
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
done, started = 0, time.monotonic()
while time.monotonic() - started < 20:
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
    done += 50
took = time.monotonic() - started
print(f"{done} products of 8192^3 bf16 in {took:.1f} s: {done * 2 * 8192**3 / took / 1e12:.0f} TFLOP/s")
EOF
step watch hpclaunch run --tasks-per-node 1 --gpus-per-node 1 --wait -- python3 busy.py
run_dir=$(ls -dt runs/*/* 2>/dev/null | head -1)
if [ -n "$run_dir" ]; then
    cp "$run_dir"/metrics/*.csv "$out"/ 2>/dev/null
    grep -h 'gpu' "$run_dir/events.jsonl" >>"$out/watch.txt" 2>/dev/null
    step watch hpclaunch top last --once
    step watch hpclaunch plot last -o "$out/gpu.png"
fi

# A packed local sweep on this machine's GPUs: each point in its own slot, its GPU alone.
cat >point.py <<'EOF'
import os, sys, torch
print("point", sys.argv[1], "CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"),
      "sees", torch.cuda.device_count(), torch.cuda.get_device_name(0))
EOF
step sweep hpclaunch sweep --pack --gpus-per-point 1 --grid i=1,2,3 --wait -- python3 point.py {i}
step sweep hpclaunch sweep status last
for log in $(ls -dt runs/*/* | head -1)/points/*/logs/rank-0.out; do cat "$log" >>"$out/sweep.txt"; done

# The stack of a running GPU program (py-spy, where it is on PATH).
if command -v py-spy >/dev/null; then
    step stack hpclaunch run --tasks-per-node 1 --gpus-per-node 1 -- python3 busy.py &
    sleep 12
    step stack hpclaunch stack last
    wait
fi
ls -l "$out"
