"""The Backend seam is small: a backend written here in a few lines drives the one
orchestrator (run folder, record, index, final state) like the real ones do."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import pytest

from hpclaunch import api, launching
from hpclaunch.backends.base import Backend, Launch
from hpclaunch.handle import Run
from hpclaunch.observe.jobend import JobStatus
from hpclaunch.records import runrecord


class InstantBackend(Backend):
    """Runs nothing: rank 0 "prints" one line and every job completes at once."""

    name = "slurm"

    def __init__(self) -> None:
        self.jobs: dict[str, str] = {}

    def start(self, launch: Launch) -> str:
        job_id = str(1000 + len(self.jobs))
        (launch.paths.logs / "rank-0.out").write_text(f"hello from {launch.spec.job_name}\n")
        self.jobs[job_id] = "COMPLETED"
        return job_id

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        return {j: JobStatus(self.jobs[j], "", "0:0") for j in job_ids if j in self.jobs}

    def cancel(self, job_id: str) -> None:
        self.jobs[job_id] = "CANCELLED"


def test_a_small_backend_drives_the_orchestrator(tmp_path: Path) -> None:
    environ = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path),
    }
    req = api.request(
        ("python3", "train.py"), {"cluster": "local", "nodes": 2}, cwd=tmp_path, environ=environ
    )
    backend = InstantBackend()
    started = launching.start(req, launching.plan_run(req), backend)
    assert runrecord.load(started.paths.run_dir).state == "PENDING"
    code, state = launching.finish(started, io.StringIO(), io.StringIO())
    assert (code, state) == (0, "COMPLETED")
    record = runrecord.load(started.paths.run_dir)
    assert (record.state, record.exit_code, record.job_id) == ("COMPLETED", 0, "1000")
    assert api.get("last", environ=environ).id == started.run_id
    assert "hello from train.py" in Run(started.paths.run_dir).logs()


def test_a_refused_start_leaves_nothing(tmp_path: Path) -> None:
    class Refusing(InstantBackend):
        def start(self, launch: Launch) -> str:
            raise RuntimeError("no")

    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path)}
    req = api.request(("true",), {"cluster": "local"}, cwd=tmp_path, environ=environ)
    planned = launching.plan_run(req)
    with pytest.raises(RuntimeError):
        launching.start(req, planned, Refusing())
    assert not planned.paths.run_dir.exists()
