"""What each rank sees on the testbed: the environment contract, GPU visibility with the
testbed's fake GPUs (two per node), and torchrun hiding Slurm's per-task variables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import PROGRAMS, Hpc

pytestmark = pytest.mark.testbed


def _dumps(hpc: Hpc, *args: str) -> list[dict[str, Any]]:
    out = hpc.folder(f"dump-{len(list(hpc.cwd.glob('dump-*')))}")
    proc = hpc.run("run", *args, "--wait", "--", "python3", str(PROGRAMS / "env_dump.py"), str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sorted(
        (json.loads(p.read_text()) for p in out.glob("env-*.json")), key=lambda d: int(d["RANK"])
    )


def test_contract_variables_on_two_nodes(hpc: Hpc) -> None:
    dumps = _dumps(hpc, "-N", "2", "--tasks-per-node", "2")
    assert [d["RANK"] for d in dumps] == ["0", "1", "2", "3"]
    assert [d["LOCAL_RANK"] for d in dumps] == ["0", "1", "0", "1"]
    assert [d["NODE_RANK"] for d in dumps] == ["0", "0", "1", "1"]
    assert {d["WORLD_SIZE"] for d in dumps} == {"4"}
    assert {d["LOCAL_WORLD_SIZE"] for d in dumps} == {"2"}
    assert {d["MASTER_ADDR"] for d in dumps} == {dumps[0]["SLURMD_NODENAME"]}
    job_id = int(dumps[0]["SLURM_JOB_ID"])
    assert int(dumps[0]["MASTER_PORT"]) >= 20000 + job_id % 12000
    assert [d["SLURM_PROCID"] for d in dumps] == ["0", "1", "2", "3"]
    run_dir = Path(dumps[0]["HPCLAUNCH_RUN_DIR"])
    assert run_dir.is_dir() and (run_dir / "run.json").is_file()
    assert Path(dumps[0]["HPCLAUNCH_CHECKPOINT_DIR"]) == run_dir / "checkpoints"
    assert {d["PYTHONNOUSERSITE"] for d in dumps} == {"1"}
    assert {d["PYTHONUNBUFFERED"] for d in dumps} == {"1"}
    assert {d["OMP_NUM_THREADS"] for d in dumps} == {"1"}
    assert {d["HPCLAUNCH_EXP"] for d in dumps} == {"default"}
    assert {d["HPCLAUNCH_PROJECT"] for d in dumps} == {hpc.cwd.name}


def test_gpu_visibility_all_and_per_task(hpc: Hpc) -> None:
    every = _dumps(hpc, "-N", "2", "--tasks-per-node", "2", "--gpus-per-node", "2")
    assert [d["CUDA_VISIBLE_DEVICES"] for d in every] == ["0,1"] * 4
    own = _dumps(hpc, "-N", "2", "--gpus-per-node", "2", "--gpu-visibility", "per-task")
    assert [d["CUDA_VISIBLE_DEVICES"] for d in own] == ["0", "1", "0", "1"]


def test_torchrun_workers_see_torchrun_ranks_not_slurm_tasks(hpc: Hpc) -> None:
    dumps = _dumps(hpc, "-N", "2", "--tasks-per-node", "2", "--launcher", "torchrun")
    assert [d["RANK"] for d in dumps] == ["0", "1", "2", "3"]
    assert {d["WORLD_SIZE"] for d in dumps} == {"4"}
    assert [d["NODE_RANK"] for d in dumps] == ["0", "0", "1", "1"]
    for dump in dumps:
        # The agent is Slurm's task; its per-task variables would mislead Lightning.
        assert dump["SLURM_PROCID"] is None and dump["SLURM_NTASKS"] is None
        assert dump["SLURM_JOB_ID"] is not None and dump["TORCHELASTIC_RUN_ID"] is not None
