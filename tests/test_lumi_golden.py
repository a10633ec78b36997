"""The `lumi` profile's batch script, pinned by a golden file and checked against
shared/LUMI.md's "Choices for the lumi profile".

A fake is unavoidable here: the testbed cannot show LUMI's partitions, AMD GPUs or
its interconnect, so this test renders the script without submitting it. The Slurm
mechanics the script relies on (srun flags, mask_cpu binding, MASTER_ADDR from the
node list) are exercised for real by the testbed tests.

Regenerate after an intended change with: UPDATE_GOLDEN=1 pytest tests/test_lumi_golden.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from hpclaunch.planning import preparing
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import render

GOLDEN = Path(__file__).parent / "golden" / "lumi_4x8_standard-g.sh"
LUMI_MD = Path(__file__).resolve().parents[2] / "shared" / "LUMI.md"
RUN_ID = "20260101-000000-000-abcd"
ENVIRON = {"USER": "alice", "HOME": "/users/alice", "PATH": "/usr/bin:/bin"}
CWD = Path("/project/project_465000000/alice/llm")

# shared/LUMI.md, "GCD -> CPU binding" and "Choices for the lumi profile".
MASKS = (
    "0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,0x00000000fe000000,"
    "0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,0x0000fe0000000000"
)


def _script(extra: dict[str, object] | None = None) -> str:
    cli: dict[str, object] = {
        "cluster": "lumi",
        "nodes": "4",
        "gpus_per_node": "8",
        "partition": "standard-g",
        "account": "project_465000000",
        "time": "1:00:00",
    }
    cli.update(extra or {})
    resolved = preparing.prepare_spec(cli, ("python", "train.py"), CWD, ENVIRON)
    spec = resolved.spec
    run_dir = Path(spec.run_root) / spec.exp / RUN_ID
    paths = RunPaths(
        run_id=RUN_ID,
        run_dir=run_dir,
        checkpoint_dir=Path(spec.checkpoint_root) / spec.exp / RUN_ID / "checkpoints",
    )
    return render.plan_batch(spec, resolved.profile, paths, CWD).script


def test_lumi_script_matches_golden_file() -> None:
    script = _script()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(script, encoding="utf-8")
    assert script == GOLDEN.read_text(encoding="utf-8")


def test_golden_file_holds_lumi_md_choices() -> None:
    text = GOLDEN.read_text(encoding="utf-8")
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=7",
        "#SBATCH --mem-per-gpu=60G",
        "#SBATCH --partition=standard-g",
        "#SBATCH --account=project_465000000",
        "#SBATCH --time=01:00:00",
        "--kill-on-bad-exit=1",
        "--distribution=block:block",
        f"--cpu-bind=verbose,mask_cpu:{MASKS}",
        'export NCCL_SOCKET_IFNAME="hsn0,hsn1,hsn2,hsn3"',
        'export NCCL_NET_GDR_LEVEL="PHB"',
        # LUMI.md's /tmp/$USER-miopen-cache-$SLURM_JOB_ID, inside the job's private folder
        'export MIOPEN_USER_DB_PATH="${HPCLAUNCH_LOCAL}/miopen"',
        'export MIOPEN_CUSTOM_CACHE_DIR="${HPCLAUNCH_LOCAL}/miopen"',
        "export HPCLAUNCH_LOCAL=/@hpclaunch-local@",
        'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1',
        "/scratch/project_465000000/alice/hpclaunch/default/",
        "/flash/project_465000000/alice/hpclaunch/default/",
    ):
        assert line in text, line
    # Visibility `all`: Slurm's ROCR_VISIBLE_DEVICES is left alone (AI2's notes).
    assert "ROCR_VISIBLE_DEVICES" not in text
    # No fixed port: it comes from the job id.
    assert not re.search(r"MASTER_PORT=(29500|25900|39591)\b", text)


@pytest.mark.skipif(not LUMI_MD.is_file(), reason="shared/LUMI.md is not beside the repository")
def test_pinned_values_are_the_ones_in_lumi_md() -> None:
    doc = LUMI_MD.read_text(encoding="utf-8")
    assert MASKS in doc
    for fact in (
        "NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3",
        "NCCL_NET_GDR_LEVEL=PHB",
        "--mem-per-gpu=60G",
        "--cpus-per-task=7",
        "MIOPEN_USER_DB_PATH=/tmp/$USER-miopen-cache-$SLURM_JOB_ID",
    ):
        assert fact in doc, fact


def test_per_task_visibility_sets_rocr_per_task() -> None:
    script = _script({"gpu_visibility": "per-task"})
    assert "export HPCLAUNCH_GPU_VARS=ROCR_VISIBLE_DEVICES" in script
    assert "export HPCLAUNCH_GPU_UNSET=HIP_VISIBLE_DEVICES" in script


def test_partial_node_gets_no_mask() -> None:
    script = _script({"partition": "small-g", "nodes": "1", "gpus_per_node": "2"})
    assert "--cpu-bind" not in script
    assert "#SBATCH --ntasks-per-node=2" in script


def test_nccl_debug_is_opt_in() -> None:
    assert "NCCL_DEBUG" not in _script()
    debug = _script({"nccl_debug": True})
    assert 'export NCCL_DEBUG="INFO"' in debug
    assert 'export NCCL_DEBUG_SUBSYS="INIT,COLL"' in debug
    assert 'NCCL_DEBUG_FILE="${HPCLAUNCH_LOCAL}/rccl-' in debug
