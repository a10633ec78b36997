"""hpclaunch doctor's probe: what a node and a rank of a job actually got.

Runs in two places of the doctor's job, standard library only (torch when the rank's
Python has it), never importing hpclaunch (rules: hpclaunch/node/__init__.py):

- ``doctor_probe.py node --out DIR [--bind PATH]... [--local DIR]``: once per node,
  from the batch script as an ``srun --overlap`` step on the node itself (outside any
  container): the GPU devices the node shows, whether each of the profile's bind
  sources exists, the free space of the node-local folder. Writes DIR/node-<node>.json.
  That the step ran at all shows ``srun --overlap`` works. The nodes' python3 (>= 3.6).
- ``doctor_probe.py rank --out DIR [--plugin NAME] [--allreduce-mib N]``: as the program
  of every rank, through the bootstrap and inside the container, exactly as a training
  program runs: its CPU affinity, its visible GPUs, whether it runs in a container and
  the network plugin library the container holds, whether MASTER_ADDR:MASTER_PORT is
  reachable from its node, and (rank 0 reports it) an all-reduce through
  torch.distributed with the job's backend and its bandwidth. Writes DIR/rank-<R>.json.
  The image's or the node's python3 (>= 3.8 as the bootstrap, 3.6 kept for the node).
"""

import argparse
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from typing import Any, Optional

CONNECT_TIMEOUT_S = 60.0  # every rank must reach rank 0 within this
PLUGIN_DIRS = ("/opt", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def node_name() -> str:
    # The bootstrap's rule: the same node has the same name in every file of a run.
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def write(out: str, name: str, data: "dict[str, Any]") -> None:
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, f".{name}.{os.getpid()}")
    with open(tmp, "w") as handle:
        json.dump(data, handle)
    os.rename(tmp, os.path.join(out, name))


def tool_gpus() -> "Optional[dict[str, Any]]":
    """GPUs the node's tool lists: nvidia-smi -L, else rocm-smi --showid --json."""
    for argv, pattern in (
        (["nvidia-smi", "-L"], r"^GPU \d+:"),
        (["rocm-smi", "--showid", "--json"], r'"card\d+"'),
    ):
        if shutil.which(argv[0]) is None:
            continue
        try:
            out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 timeout=60).stdout.decode(errors="replace")  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            continue
        return {"tool": argv[0], "count": len(re.findall(pattern, out, re.M))}
    return None


def visible_gpus() -> "dict[str, str]":
    """The GPUs this process may use, as the job's variables name them."""
    found = {}  # type: dict[str, str]
    for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                 "SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS", "GPU_DEVICE_ORDINAL"):  # fmt: skip
        if os.environ.get(name, "") != "":
            found[name] = os.environ[name]
    return found


def probe_node(args: argparse.Namespace) -> int:
    local = os.path.expandvars(args.local) if args.local else ""
    free = None
    if local:
        existing = local
        while existing and not os.path.isdir(existing):
            existing = os.path.dirname(existing)
        try:
            free = shutil.disk_usage(existing or "/").free
        except OSError:
            free = None
    data = {
        "node": node_name(),
        "gpus": visible_gpus(),
        "tool": tool_gpus(),
        "devices": len(glob.glob("/dev/nvidia[0-9]*")) + len(glob.glob("/dev/dri/renderD*")),
        "binds": {path: os.path.exists(path) for path in args.bind},
        "local": local,
        "local_free_bytes": free,
    }
    write(args.out, f"node-{data['node']}.json", data)
    return 0


def container() -> str:
    """The runtime this process runs in, if any (each sets a variable of its own)."""
    for name, runtime in (("APPTAINER_CONTAINER", "apptainer"),
                          ("SINGULARITY_CONTAINER", "singularity"),
                          ("CH_RUNNING", "charliecloud")):  # fmt: skip
        if os.environ.get(name):
            return runtime
    return ""


def find_plugin(name: str) -> "list[str]":
    """Files of the network plugin library NAME (e.g. librccl-net) this process sees:
    on LD_LIBRARY_PATH, then in the usual library folders."""
    if not name:
        return []
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    found = []  # type: list[str]
    for folder in dirs + list(PLUGIN_DIRS):  # one level each: /opt/cray is huge
        found += glob.glob(os.path.join(folder, name + "*.so*"))
        found += glob.glob(os.path.join(folder, "*", "lib*", name + "*.so*"))
    return sorted(set(found))[:5]


def rendezvous(rank: int, world: int) -> "dict[str, Any]":
    """Rank 0 listens on MASTER_PORT; every other rank connects to MASTER_ADDR there."""
    addr, port = os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT", "0"))
    if not addr or not port:
        return {"ok": False, "error": "MASTER_ADDR or MASTER_PORT is not set"}
    where = f"{addr}:{port}"
    if rank == 0:
        return serve(port, world - 1, where)
    deadline, error = time.time() + CONNECT_TIMEOUT_S, ""
    while time.time() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=5) as conn:
                conn.sendall(f"{rank}\n".encode())
                conn.recv(16)
            return {"ok": True, "address": where}
        except OSError as exc:
            error = str(exc)
            time.sleep(0.2)
    return {"ok": False, "address": where, "error": error}


def serve(port: int, expected: int, where: str) -> "dict[str, Any]":
    try:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", port))
        server.listen(max(1, expected))
    except OSError as exc:
        return {"ok": False, "address": where, "error": f"cannot listen: {exc}"}
    server.settimeout(CONNECT_TIMEOUT_S)
    seen = 0
    try:
        while seen < expected:
            conn, _ = server.accept()
            with conn:
                conn.recv(16)
                conn.sendall(b"ok\n")
            seen += 1
    except OSError as exc:
        error = f"{seen} of {expected} ranks connected: {exc}"
        return {"ok": False, "address": where, "error": error}
    finally:
        server.close()
    return {"ok": True, "address": where, "connected": seen}


def allreduce(mib: int) -> "dict[str, Any]":
    """An all-reduce of MIB MiB through torch.distributed (nccl with GPUs, else gloo):
    the bus bandwidth of the best of a few rounds, as nccl-tests reports it."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return {"ok": None, "error": "torch is not importable by the ranks' Python"}
    try:
        cuda = torch.cuda.is_available()
        backend = "nccl" if cuda else "gloo"
        dist.init_process_group(backend)
        world = dist.get_world_size()
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu"
        if cuda:
            torch.cuda.set_device(device)
        data = torch.ones(mib * 262144, dtype=torch.float32, device=device)
        best = float("inf")
        for _ in range(4):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(data)
            if cuda:
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        ok = abs(float(data[0]) - world**4) < 1e-3 * world**4  # four rounds of a sum
        dist.destroy_process_group()
        bus = 2.0 * (world - 1) / world * data.numel() * 4 / best if world > 1 else 0.0
        return {"ok": ok, "backend": backend, "world": world, "mib": mib,
                "seconds": best, "bus_gbps": bus / 1e9}  # fmt: skip
    except Exception as exc:  # a failed collective is the finding, not a crash
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def probe_rank(args: argparse.Namespace) -> int:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    data = {
        "rank": rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "node": node_name(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "gpus": visible_gpus(),
        "tool": tool_gpus(),
        "container": container(),
        "plugin": find_plugin(args.plugin),
        "rendezvous": rendezvous(rank, world),
    }
    data["allreduce"] = allreduce(args.allreduce_mib) if args.allreduce_mib else None
    write(args.out, f"rank-{rank}.json", data)
    return 0


def main(argv: "list[str]") -> int:
    parser = argparse.ArgumentParser(prog="doctor_probe.py")
    parser.add_argument("what", choices=("node", "rank"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--bind", action="append", default=[])
    parser.add_argument("--local", default="")
    parser.add_argument("--plugin", default="")
    parser.add_argument("--allreduce-mib", type=int, default=0)
    args = parser.parse_args(argv)
    return probe_node(args) if args.what == "node" else probe_rank(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
