"""Stands in for NCCL's debug output under --nccl-debug: a gloo job writes nothing to
NCCL_DEBUG_FILE, so this program writes that file itself, naming it as NCCL does (%h:
the host name up to its first dot, %p: the process id, %%: a percent sign), after a real
gloo all_reduce when WORLD_SIZE > 1. Prints the file's path; rank FAIL_RANK (environment)
then, after FAIL_AFTER seconds, exits with FAIL_CODE, or kills itself with signal
-FAIL_CODE."""

import os
import socket
import sys
import time


def nccl_name(pattern: str) -> str:
    host = socket.gethostname().split(".")[0]
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        i += 1
        if ch != "%" or i == len(pattern):
            out.append(ch)
            continue
        code = pattern[i]
        i += 1
        out.append({"%": "%", "h": host, "p": str(os.getpid())}.get(code, "%" + code))
    return "".join(out)


rank = int(os.environ["RANK"])
if int(os.environ["WORLD_SIZE"]) > 1:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()
path = nccl_name(os.environ["NCCL_DEBUG_FILE"])
with open(path, "w") as handle:
    handle.write(f"{socket.gethostname()}:{os.getpid()} NCCL INFO rank {rank} stand-in\n")
print("wrote", path, flush=True)
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    time.sleep(float(os.environ.get("FAIL_AFTER", "0")))
    code = int(os.environ.get("FAIL_CODE", "3"))
    if code < 0:
        os.kill(os.getpid(), -code)
    sys.exit(code)
