"""Code snapshots and run records on the testbed: an edit made before submission is in
the record's diff; an edit made after submission, while the job waits behind another,
does not change what it runs; `rerun` runs the original snapshot again (or the current
code with --current-code); an oversized snapshot is refused naming the largest file."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import testbed
from conftest import Hpc

pytestmark = pytest.mark.testbed

PROGRAM = "print('version {v}', open('data/input.txt').read().strip(), flush=True)\n"


def _git(hpc: Hpc, project: Path, *args: str) -> None:
    proc = hpc.cmd(["git", "-C", str(project), *args])
    assert proc.returncode == 0, proc.stderr


def _project(hpc: Hpc) -> Path:
    """A git project made by the test user: tracked prog.py, git-ignored data/ and runs/."""
    project = hpc.folder("proj")
    (project / "prog.py").write_text(PROGRAM.format(v=1))
    (project / ".gitignore").write_text("data/\nruns/\n")
    (project / "data").mkdir()
    (project / "data" / "input.txt").write_text("data-ok")
    for path in (project / "prog.py", project / ".gitignore", project / "data"):
        _chown(hpc, path)
    _chown(hpc, project / "data" / "input.txt")
    _git(hpc, project, "init", "-q")
    _git(hpc, project, "add", "prog.py", ".gitignore")
    _git(hpc, project, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "v1")
    return project


def _chown(hpc: Hpc, path: Path) -> None:
    import os

    info = hpc.cwd.stat()
    os.chown(path, info.st_uid, info.st_gid)


def _in(hpc: Hpc, project: Path) -> Hpc:
    return Hpc(cwd=project, env=hpc.env)


def _wait_done(hpc: Hpc, run_id: str, timeout: float = 180) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    pause = 0.5  # growing to 3 s: each look is a whole `hpclaunch status` (~0.4 s of CPU)
    while True:
        proc = hpc.run("status", run_id, "--json")
        record = json.loads(proc.stdout) if proc.returncode == 0 else {}
        if record.get("state") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return record
        assert time.monotonic() < deadline, proc.stdout + proc.stderr
        time.sleep(pause)
        pause = min(pause * 1.5, 3)


def _output(run_dir: Path) -> str:
    return (run_dir / "logs" / "rank-0.out").read_text()


def test_queued_job_runs_the_code_as_submitted(hpc: Hpc) -> None:
    """The job waits in the queue (for its begin time: the testbed's cores are shared,
    OverSubscribe=FORCE, so no blocker job can keep it pending; not --hold, which the
    reruns below would repeat) while the project changes."""
    project = _project(hpc)
    here = _in(hpc, project)
    (project / "prog.py").write_text(PROGRAM.format(v=2))  # before submission: in the diff
    later = "--sbatch-arg=--begin=now+10"
    proc = here.run("run", "-N", "2", later, "--json", "--", "python3", "prog.py")
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout)
    run_dir = Path(job["run_dir"])
    assert "PENDING" in hpc.cmd(["squeue", "-h", "-j", job["job_id"], "-o", "%T"]).stdout
    (project / "prog.py").write_text(PROGRAM.format(v=3))  # after submission: not run
    record = _wait_done(hpc, job["run_id"])
    assert record["state"] == "COMPLETED", record
    assert "version 2 data-ok" in _output(run_dir)  # the ignored data/ is linked in
    diff = (run_dir / "git.diff").read_text()
    assert "+print('version 2'" in diff and "version 3" not in diff
    full = json.loads((run_dir / "run.json").read_text())
    assert full["code"]["snapshot"]["files"] == 2 and full["code"]["diff"] == "git.diff"
    assert full["code"]["cwd"] == str(run_dir / "code")
    assert full["git"]["dirty"] is True
    shown = hpc.run("show", job["run_id"])
    assert "+print('version 2'" in shown.stdout

    # rerun: the original snapshot again, though the project says version 3 now.
    again = hpc.run("rerun", job["run_id"], "--wait")
    assert again.returncode == 0, again.stderr
    assert "version 2 data-ok" in again.stdout
    current = hpc.run("rerun", job["run_id"], "--current-code", "--wait")
    assert current.returncode == 0, current.stderr
    assert "version 3 data-ok" in current.stdout
    live = here.run("run", "--no-snapshot", "--wait", "--", "python3", "prog.py")
    assert live.returncode == 0 and "version 3" in live.stdout, live.stderr
    testbed.wait_jobs_gone(hpc.cwd, timeout=60)


def test_a_snapshot_over_the_limit_is_refused_naming_the_largest_file(hpc: Hpc) -> None:
    project = _project(hpc)
    (project / "weights.bin").write_bytes(b"\0" * (3 * 2**20))  # untracked, not ignored
    _chown(hpc, project / "weights.bin")
    proc = _in(hpc, project).run("run", "--snapshot-limit", "1M", "--", "python3", "prog.py")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "weights.bin" in line and "--no-snapshot" in line, line
    assert not (project / "runs").exists()
