"""The rank contract of a 2-node x 2-rank job, from what tests/programs/container_probe.py
wrote (one probe-R.json per rank); no tests in here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import testbed


def two_by_two(out: Path) -> list[dict[str, Any]]:
    """The four ranks' reports, by rank, once each shows its place in a 2 x 2 job: ranks,
    local ranks, node ranks, the world, rank 0's node as MASTER_ADDR, and the TCP
    rendezvous over MASTER_ADDR:MASTER_PORT (each rank sent its rank to rank 0)."""
    reports = sorted(
        (json.loads(p.read_text()) for p in out.glob("probe-*.json")),
        key=lambda r: int(r["env"]["RANK"]),
    )
    assert len(reports) == 4, reports
    env_seen = [r["env"] for r in reports]
    assert [e["RANK"] for e in env_seen] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in env_seen] == ["0", "1", "0", "1"]
    assert [e["NODE_RANK"] for e in env_seen] == ["0", "0", "1", "1"]
    assert [e["SLURM_PROCID"] for e in env_seen] == ["0", "1", "2", "3"]
    assert {e["WORLD_SIZE"] for e in env_seen} == {"4"}
    nodes = [e["SLURMD_NODENAME"] for e in env_seen]
    if testbed.layout() == "netns":
        assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
    assert {e["MASTER_ADDR"] for e in env_seen} == {nodes[0]}
    assert {r["total"] for r in reports} == {6}  # TCP over MASTER_ADDR:MASTER_PORT
    return reports
