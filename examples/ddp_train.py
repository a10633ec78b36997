"""A small, plain torch.distributed DDP training program (nothing hpclaunch-specific).

It reads the standard env:// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
LOCAL_RANK) that torchrun and hpclaunch provide, so the same file runs under

    python examples/ddp_train.py                         # one process, no env needed
    torchrun --standalone --nproc-per-node=2 examples/ddp_train.py
    hpclaunch run -N 2 --tasks-per-node 2 -- python examples/ddp_train.py

The data is a fixed synthetic set drawn from --seed. Every step all ranks draw the same
global batch and each trains on its own equal shard; DDP averages the gradients, which
for a mean loss over equal shards is exactly the gradient of the whole global batch. So
the final parameters match a one-process run up to float rounding: the end-to-end
tests use that as their check.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN_DIM, HIDDEN = 8, 16


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--global-batch", type=int, default=32, help="split evenly over the ranks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", type=Path, help="write this rank's final parameters as JSON")
    return p.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed() -> tuple[int, int, int, torch.device]:
    if "WORLD_SIZE" not in os.environ:
        # Started as a plain script: be a group of one, so there is a single code path.
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), local_rank, device


def global_batch(step: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Drawn from (seed, step) alone, so every rank (and a one-process run) sees the same batch.
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(size, IN_DIM, generator=g)
    w_true = torch.linspace(-1.0, 1.0, IN_DIM)
    y = torch.sin(x @ w_true).unsqueeze(1) + 0.05 * torch.randn(size, 1, generator=g)
    return x, y


def save_params(path: Path, model: nn.Module, rank: int, world: int) -> None:
    # hpclaunch expands `{rank}` in arguments before we start; plain torchrun does not,
    # so expand it here too (a no-op under hpclaunch) to keep one file per rank.
    path = Path(str(path).replace("{rank}", str(rank)))
    path.parent.mkdir(parents=True, exist_ok=True)
    params = {n: p.detach().cpu().double().flatten().tolist() for n, p in model.named_parameters()}
    record = {"rank": rank, "world_size": world, "host": socket.gethostname(), "params": params}
    path.write_text(json.dumps(record))


def main() -> None:
    args = parse_args()
    rank, world, local_rank, device = init_distributed()
    print(f"rank {rank}/{world} on {socket.gethostname()} local_rank {local_rank}", flush=True)
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} must be a multiple of {world} ranks")
    shard = args.global_batch // world

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    net = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1)).to(device)
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    log_every = max(1, args.steps // 10)

    for step in range(args.steps):
        x, y = global_batch(step, args.global_batch, args.seed)
        x, y = x[rank * shard : (rank + 1) * shard].to(device), y[rank * shard : (rank + 1) * shard]
        loss = nn.functional.mse_loss(model(x), y.to(device))  # mean over this rank's shard
        opt.zero_grad()
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()
        if step % log_every == 0 or step == args.steps - 1:
            # Average the shard losses so rank 0 prints the global-batch loss.
            total = loss.detach().clone()
            dist.all_reduce(total)
            if rank == 0:
                print(f"step {step:4d} loss {total.item() / world:.6f}", flush=True)

    if args.save:
        save_params(args.save, net, rank, world)
    # Free DDP's reducer (and the gloo work it holds) while the interpreter is fully
    # alive, and let every rank get here before rank 0, which hosts the rendezvous store,
    # tears down: torch's gloo teardown can otherwise abort a rank at exit
    # ("terminate called without an active exception").
    del model, opt
    dist.barrier()
    dist.destroy_process_group()
    # Leave without interpreter finalization: with torch's gloo backend it can still
    # destroy C++ objects whose threads hold Python references and abort the process
    # (seen here once in a few dozen runs on a loaded 2-core machine). Everything this
    # program owns is written and flushed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
