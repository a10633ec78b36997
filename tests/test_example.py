"""examples/ddp_train.py trains to the same parameters with 1 process and with 2 ranks."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_check import assert_params_equal_reference

# find_spec, not importorskip: importing torch (~3 s) in every pytest worker that collects
# this module would cost more than the test.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ddp_train.py"
ARGS = ["--steps", "20", "--global-batch", "16", "--seed", "3"]


# Rank variables from an outer launcher (e.g. tests run inside a job) must not leak in.
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run(argv: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{argv} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_two_ranks_match_one_process(tmp_path: Path) -> None:
    ref = tmp_path / "ref.json"
    out = run([sys.executable, str(EXAMPLE), *ARGS, "--save", str(ref)], tmp_path)
    assert "rank 0/1 on " in out

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    template = tmp_path / "params-{rank}.json"
    out = run(
        [*torchrun, "--nproc-per-node=2", str(EXAMPLE), *ARGS, "--save", str(template)], tmp_path
    )
    assert "rank 0/2 on " in out and "rank 1/2 on " in out

    files = [tmp_path / f"params-{r}.json" for r in range(2)]
    assert_params_equal_reference(files, ref)
