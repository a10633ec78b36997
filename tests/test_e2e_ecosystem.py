"""Programs from the ecosystem, unmodified, through hpclaunch on the testbed and locally:
PyTorch Lightning (which detects Slurm, or torchrun under --launcher torchrun) and JAX
(`jax.distributed.initialize()` with no arguments reads Slurm's variables)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from builders import skip_without
from conftest import PROGRAMS, Hpc

pytestmark = pytest.mark.testbed


def _records(out: Path, pattern: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(pattern))]


@pytest.mark.parametrize(
    ("cluster", "launcher", "environment"),
    [
        ("slurm", "srun", "SLURMEnvironment"),
        ("slurm", "torchrun", "TorchElasticEnvironment"),
        ("local", "srun", "SLURMEnvironment"),
    ],
)
def test_lightning_ddp(hpc: Hpc, cluster: str, launcher: str, environment: str) -> None:
    skip_without("lightning")
    out = hpc.folder("lt")
    proc = hpc.run(
        "run",
        "--cluster",
        cluster,
        "-N",
        "2",
        "--tasks-per-node",
        "2",
        "--launcher",
        launcher,
        "--wait",
        "--",
        "python",
        str(PROGRAMS / "lightning_train.py"),
        str(out),
        "2",
        "2",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = _records(out, "lightning-*.json")
    assert [r["global_rank"] for r in records] == [0, 1, 2, 3]
    assert [r["node_rank"] for r in records] == [0, 0, 1, 1]
    assert {r["world_size"] for r in records} == {4}
    assert {r["environment"] for r in records} == {environment}
    assert len({json.dumps(r["weight"]) for r in records}) == 1  # DDP kept them in step


@pytest.mark.parametrize("cluster", ["slurm", "local"])
def test_jax_distributed_initialize(hpc: Hpc, cluster: str) -> None:
    skip_without("jax")
    out = hpc.folder("jx")
    proc = hpc.run(
        "run",
        "--cluster",
        cluster,
        "-N",
        "2",
        "--tasks-per-node",
        "2",
        "--wait",
        "--",
        "python",
        str(PROGRAMS / "jax_init.py"),
        str(out),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = _records(out, "jax-*.json")
    assert [r["process_index"] for r in records] == [0, 1, 2, 3]
    assert {(r["process_count"], r["global_devices"], r["sum"]) for r in records} == {(4, 4, 10)}
