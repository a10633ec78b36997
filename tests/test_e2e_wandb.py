"""W&B on the testbed: the real wandb package offline through `hpclaunch run`, and
`hpclaunch sweep --wandb-sweep` with the stand-in agent (tests/doubles/wandb: the W&B
service cannot be reached from here, so what the real service decides, the parameters of
each run, comes from a local sweep file; see tests/doubles/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import PROGRAMS, VENV_BIN, Hpc

pytestmark = pytest.mark.testbed

TRAIN = str(PROGRAMS / "wandb_train.py")
KEY = "0123456789abcdef0123456789abcdef01234567"  # W&B keys are 40 hex digits


def _files_holding(root: Path, text: str) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if text.encode() in path.read_bytes():
                    found.append(str(path))
            except OSError:
                pass
    return found


def test_real_wandb_offline_through_run_keeps_the_key_secret(hpc: Hpc) -> None:
    pytest.importorskip("wandb")
    out = hpc.folder("out")
    proc = hpc.run(
        "run", "--wait", "--env", "WANDB_MODE=offline", "--",
        str(VENV_BIN / "python"), TRAIN, str(out), "--lr", "0.5",
        env={"WANDB_API_KEY": KEY}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report-0.json").read_text())
    assert report["key_seen"] and not report["key_in_cmdline"]
    offline = list((out / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and report["run_dir"].startswith(str(offline[0]))
    assert _files_holding(hpc.cwd, KEY) == []  # not in the run folder, logs, W&B's files
