"""Issue 24 item 4 on the testbed, as hpcuser: everything a run and a sweep leave (run
root, run and sweep folders, snapshots, diffs, Slurm's output, the ranks' logs, the
index) is unreadable by group and others under umask 022 and 002, and a profile's [env]
secret reaches the ranks on both nodes but no file."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from conftest import Hpc
from test_private import CHECK_ENV, GROUP, OTHERS, SECRET, exposed, files_holding, walk

pytestmark = pytest.mark.testbed


def _as_umask(hpc: Hpc, mask: int, *args: str, timeout: float = 240) -> str:
    proc = hpc.cmd(["sh", "-c", f'umask {mask:03o} && exec "$@"', "sh", "hpclaunch", *args],
                   timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def _git_project(hpc: Hpc) -> None:
    (hpc.cwd / "train.py").write_text("import sys; print('trained', sys.argv[1:])\n")
    commit = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1"]
    for argv in (["git", "init", "-q"], ["git", "add", "train.py"], commit):
        done = hpc.cmd(argv)
        assert done.returncode == 0, done.stderr
    (hpc.cwd / "train.py").write_text("import sys; print('changed', sys.argv[1:])\n")


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_a_run_and_a_sweep_on_slurm_leave_nothing_readable(hpc: Hpc, mask: int) -> None:
    _git_project(hpc)
    _as_umask(hpc, mask, "run", "-N", "2", "--wait", "--", "python3", "train.py", "x")
    out = _as_umask(hpc, mask, "sweep", "--json", "--grid", "lr=1,2", "--", "python3",
                    "train.py", "--lr={lr}")  # fmt: skip
    sweep_id = json.loads(out.splitlines()[0])["sweep_id"]
    _as_umask(hpc, mask, "sweep", "wait", sweep_id)
    runs = hpc.cwd / "runs"
    index = Path(hpc.env["XDG_DATA_HOME"]) / "hpclaunch"
    logs = [p for p in walk(runs) if p.name in ("batch.out", "rank-0.out")]
    assert logs and list(runs.glob("default/*/code/train.py")), sorted(map(str, walk(runs)))
    assert list(runs.glob("default/*/git.diff")) and (index / "runs.jsonl").is_file()
    for top in (runs, index):
        assert exposed(top, OTHERS) == []
        assert exposed(top, GROUP) == []
    for path in [runs, runs / "default", *runs.glob("default/*")]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in walk(runs):
        if path.name in ("run.json", "spec.json", "job.sh", "git.diff", "sweep.json", "train.py"):
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


def test_a_profile_env_secret_reaches_ranks_on_both_nodes_and_no_file(hpc: Hpc) -> None:
    clusters = Path(hpc.env["XDG_CONFIG_HOME"]) / "hpclaunch" / "clusters"
    hpc.cmd(["mkdir", "-p", str(clusters)])
    (clusters / "slurm.toml").write_text(f'[env]\nDB_PASS = "{SECRET}"\n')
    program = CHECK_ENV.replace("a.split", "bytes.fromhex(a).decode().split")
    arg = f"DB_PASS={SECRET}".encode().hex()
    dry = hpc.run("run", "--dry-run", "--", "python3", "-c", program, arg)
    assert dry.returncode == 0 and SECRET not in dry.stdout + dry.stderr, dry.stderr
    done = hpc.run("run", "-N", "2", "--wait", "--", "python3", "-c", program, arg, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert SECRET not in done.stdout + done.stderr
    run_dir = hpc.run_dirs()[-1]
    assert len(list((run_dir / "logs").glob("rank-*.out"))) == 2
    assert all("env ok" in p.read_text() for p in (run_dir / "logs").glob("rank-*.out"))
    index = Path(hpc.env["XDG_DATA_HOME"]) / "hpclaunch" / "runs.jsonl"  # beside the profile
    assert index.is_file() and files_holding(SECRET, hpc.cwd / "runs", index) == []
