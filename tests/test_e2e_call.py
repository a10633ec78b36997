"""hpclaunch.call on the real testbed (issue 35): a gloo all-reduce on 2 nodes x 2 ranks
returns 4 results in rank order from both nodes, submitted by an unprivileged user's
script; a failing rank's exception comes back with its node; inside an salloc
allocation the call is a step of it (no new job)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

import testbed
from conftest import PROGRAMS, Hpc

pytestmark = pytest.mark.testbed
CALL_USER = str(PROGRAMS / "call_user.py")


def _seen(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return seen


def _check_all_reduce(seen: dict[str, Any]) -> None:
    results = seen["results"]
    assert [r[:2] for r in results] == [[0, 4], [1, 4], [2, 4], [3, 4]]
    assert {r[3] for r in results} == {5.0}  # (1 + 2 + 3 + 4) * 0.5 on every rank
    hosts = 2 if testbed.layout() == "netns" else 1
    assert len({r[2] for r in results}) == hosts
    assert seen["command"] == ["__main__.all_reduce"]


def test_gloo_all_reduce_on_two_nodes(hpc: Hpc) -> None:
    seen = _seen(hpc.cmd(["python3", CALL_USER, "slurm", "all_reduce"], timeout=400))
    _check_all_reduce(seen)
    assert seen["step"] is False


def test_rank_3_raising_on_the_testbed(hpc: Hpc) -> None:
    seen = _seen(hpc.cmd(["python3", CALL_USER, "slurm", "raises"], timeout=400))
    assert seen["type"] == "ValueError", seen
    where, remote = seen["notes"]
    node = where.removeprefix("raised on rank 3, node ").split(" ")[0]
    assert node in testbed.node_names(), where
    assert "ValueError: rank 3 says no" in remote
    assert seen["state"] == "FAILED"
    # The job ends with rank 3: the other ranks are not left to sleep their 120 s.
    assert 0 <= seen["ran_seconds"] < 60, seen


def test_call_inside_salloc_is_a_step(hpc: Hpc) -> None:
    argv = ["salloc", "-N", "2", "--ntasks-per-node=2", "python3", CALL_USER, "slurm"]
    proc = hpc.cmd([*argv, "all_reduce"], timeout=400)
    seen = _seen(proc)
    _check_all_reduce(seen)
    granted = re.search(r"Granted job allocation (\d+)", proc.stderr)
    assert granted and seen["job_id"] == granted.group(1)  # no job of its own
    assert seen["step"] is True


def test_gloo_all_reduce_inside_the_charliecloud_image(hpc: Hpc, user_image: Path) -> None:
    """The image has Python but no cloudpickle (the caller's copy is shipped) and no torch
    (the host venv's, bound at its own path)."""
    torch = importlib.util.find_spec("torch")  # not imported here: ~3 s of this worker's CPU
    assert torch is not None and torch.origin, "no torch in the test venv"
    site = str(Path(torch.origin).parents[1])
    argv = ["python3", CALL_USER, "slurm", "image", str(user_image), site]
    seen = _seen(hpc.cmd(argv, timeout=400))
    results = seen["results"]
    _check_all_reduce({"results": [r[:4] for r in results], "command": ["__main__.all_reduce"]})
    for *_, shipped, lacks, image in results:
        assert "/call/lib/cloudpickle/" in shipped and lacks and image


def test_three_submits_and_run_option_keywords_on_the_testbed(hpc: Hpc) -> None:
    seen = _seen(hpc.cmd(["python3", CALL_USER, "slurm", "three"], timeout=400))
    assert len(set(seen["ids"])) == 3
    assert seen["results"] == [[f"{i}/t/0", f"{i}/t/1"] for i in range(3)]
    assert seen["done"] == [True, True, True]
    assert _seen(hpc.cmd(["python3", CALL_USER, "slurm", "kwargs"]))["results"] == ["5/x/0"]
