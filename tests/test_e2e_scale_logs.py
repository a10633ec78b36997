"""Logs at scale on the testbed's real Slurm (issue 34): 80 ranks on the 2 nodes with
--overcommit (Slurm's own option), above the default node_logs_above of 64, 8 of them
failing with the same message. The ranks write one log file per node (lines tagged
`[node rank]`) plus the batch log, the console shows rank 0's lines and the 8 ranks'
error once as one grouped line, the job ends with the error digest, and `logs --rank R`
reads one rank back from its node's file. Unit side: tests/test_node_logs.py."""

from __future__ import annotations

import shutil

import pytest

from conftest import PROGRAMS, Hpc

pytestmark = pytest.mark.testbed

FAILING = [3, 13, 23, 33, 43, 53, 63, 73]
ERROR = "RuntimeError: CUDA out of memory (simulated)"


def test_eighty_ranks_one_file_a_node_grouped_errors_and_digest(hpc: Hpc) -> None:
    shutil.copy(PROGRAMS / "many_fail.py", hpc.cwd / "many_fail.py")
    proc = hpc.run(
        "run", "-N", "2", "--tasks-per-node", "40", "--overcommit", "--wait", "--",
        "python3", "many_fail.py", timeout=600,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    [run_dir] = hpc.run_dirs()
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    # At most one log file per node plus the batch log (ranks.tsv, exits.jsonl: one each).
    assert logs == ["batch.out", "exits.jsonl", "node-node1.log", "node-node2.log", "ranks.tsv"]
    node1 = (run_dir / "logs" / "node-node1.log").read_text()
    assert "[node1 0] rank 0 says hello\n" in node1 and f"[node1 3] {ERROR}\n" in node1
    # The console: rank 0's lines, the 8 ranks' error once, grouped; no other rank's line.
    out = proc.stdout
    assert "[node1 0] rank 0 says hello" in out, out
    grouped = f"ranks 3, 13, 23 ... (8 ranks): {ERROR}"
    assert out.count(grouped) == 1 and out.count(ERROR) == 1, out
    assert "rank 5 up" not in out and "rank 79 up" not in out
    # The digest: the first rank to fail, its last lines, how many printed the same error.
    err = proc.stderr
    assert "failed first (exit 1)" in err and f"  {ERROR}" in err, err
    assert f"hpclaunch: {grouped.split(':')[0]} printed: {ERROR}" in err, err
    # One rank read back from its node's file.
    one = hpc.run("logs", "last", "--rank", "53", timeout=120)
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == ["[node2 53] rank 53 up", f"[node2 53] {ERROR}"]
