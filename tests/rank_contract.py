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


def staged_venv_bind(
    reports: list[dict[str, Any]], run_dir: Path, venv: Path, cwd: Path, secret: str
) -> None:
    """What every rank of a 2 x 2 run with --stage, --venv, a --bind and `--env NAME` (the
    value `secret`) shows inside its image: the venv made in that image (the bootstrap
    activated it), the staged data (a node-local folder under the host's /tmp, bound in)
    and the bind, the run folder and working directory, and the secret in the ranks'
    environment only: on no command line and in no file of the run."""
    env_seen = [r["env"] for r in reports]
    assert {e["PYTHONNOUSERSITE"] for e in env_seen} == {"1"}
    assert {e["WANDB_API_KEY"] for e in env_seen} == {secret}
    assert {e["VIRTUAL_ENV"] for e in env_seen} == {str(venv)}
    assert {r["executable"] for r in reports} == {f"{venv}/bin/python3"}
    assert {r["bind"] for r in reports} == {"staged"}
    assert {r["mapped"] for r in reports} == {"mapped"}
    assert {e["HPCLAUNCH_RUN_DIR"] for e in env_seen} == {str(run_dir)}
    assert sorted(p.name for p in run_dir.glob("written-by-*")) == [
        f"written-by-{n}" for n in range(4)
    ]
    assert {r["cwd"] for r in reports} == {str(cwd)}
    assert {tuple(r["secret_in_cmdlines"]) for r in reports} == {()}
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
