"""Runs INSIDE a container image (standard library only): reports what the rank sees
and exchanges its rank over TCP with rank 0 at MASTER_ADDR:MASTER_PORT.

Usage: container_probe.py OUT_DIR BIND_FILE MAPPED_FILE
Writes OUT_DIR/probe-<rank>.json.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

CONTRACT = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HPCLAUNCH_RUN_DIR",
    "HPCLAUNCH_CHECKPOINT_DIR",
    "HPCLAUNCH_RUN_ID",
    "SLURM_PROCID",
    "SLURM_JOB_ID",
    "SLURMD_NODENAME",
    "PYTHONNOUSERSITE",
    "CH_RUNNING",
    "HOST_ONLY_VARIABLE",
    "WANDB_API_KEY",
    "PATH",
    "VIRTUAL_ENV",
)


def _recv_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            break
        data += chunk
    return data.decode().strip()


def exchange(rank: int, world: int, addr: str, port: int) -> int:
    """Rank 0 sums every rank's number and sends the total back to each."""
    if rank == 0:
        server = socket.create_server(("", port))
        server.settimeout(60)
        conns = [server.accept()[0] for _ in range(world - 1)]
        total = sum(int(_recv_line(c)) for c in conns)
        for conn in conns:
            conn.sendall(f"{total}\n".encode())
            conn.close()
        return total
    deadline = time.time() + 60
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall(f"{rank}\n".encode())
    total = int(_recv_line(conn))
    conn.close()
    return total


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def cmdlines_holding(secret: str) -> list[str]:
    """Command lines on this node (the container shares the host's PIDs) holding secret."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    if secret.encode() in handle.read():
                        found.append(pid)
            except OSError:
                pass
    return found


def main() -> None:
    out, bind_file, mapped_file = sys.argv[1:4]
    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    total = exchange(rank, world, env["MASTER_ADDR"], int(env["MASTER_PORT"]))
    run_dir = env["HPCLAUNCH_RUN_DIR"]
    with open(os.path.join(run_dir, f"written-by-{rank}"), "w") as handle:
        handle.write("ok")
    report = {
        "env": {k: env.get(k) for k in CONTRACT},
        "total": total,
        "bind": _read(bind_file),
        "mapped": _read(mapped_file),
        "image_marker": os.path.exists("/hpclaunch-test-image"),
        "executable": sys.executable,
        "cwd": os.getcwd(),
        "secret_in_cmdlines": cmdlines_holding(env.get("WANDB_API_KEY") or "unset"),
    }
    with open(os.path.join(out, f"probe-{rank}.json"), "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    main()
