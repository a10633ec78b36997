"""--after and --chain without Slurm: parsing, refusals, the rendered chain script, the
chain's state from its members. On the testbed: tests/test_e2e_dependencies.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from builders import cli_spec
from hpclaunch.backends.runstatus import why_never_started
from hpclaunch.config.profiles import load_profile
from hpclaunch.errors import UserError
from hpclaunch.observe.jobend import JobStatus, chain_status
from hpclaunch.planning.dependencies import After, parse, sbatch_value
from hpclaunch.records import runrecord
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.records.runrecord import RunRecord
from hpclaunch.script.render import plan_batch, preview


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def test_parse() -> None:
    assert parse("20261123-1200") == ("20261123-1200", "ok")
    assert parse("last:any") == ("last", "any")
    assert parse("1234:notok") == ("1234", "notok")
    with pytest.raises(UserError) as info:
        parse("last:done")
    assert info.value.render().startswith("--after: 'last:done'")


def test_sbatch_value_only_for_runs_still_active() -> None:
    after = [
        After("a", "a", "/r/a", "ok", "RUNNING", ("11",)),
        After("b", "b", "/r/b", "any", "COMPLETED", ()),
        After("s", "s", "/r/s", "notok", "2 PENDING", ("12", "13")),
    ]
    assert sbatch_value(after) == "afterok:11,afternotok:12:13"
    assert sbatch_value(after[1:2]) == ""


@pytest.mark.parametrize(
    ("values", "cluster", "step", "expected"),
    [
        ({"chain": 3}, "local", False, "--chain: not for a local run"),
        ({"chain": 3}, "slurm", True, "--chain: not for a step of the current allocation"),
        ({"after": ("x",)}, "local", False, "--after: not for a local run"),
        ({"chain": 0}, "slurm", False, "--chain: 0 (1 to 100)"),
        ({"chain": 2, "requeue": True, "time": 600}, "slurm", False, "--chain: with --requeue"),
    ],
)
def test_refusals(values: dict[str, Any], cluster: str, step: bool, expected: str) -> None:
    with pytest.raises(UserError) as info:
        cli_spec(values, cluster, step)
    assert expected in info.value.render()


def test_chain_script_and_preview(tmp_path: Path) -> None:
    spec = cli_spec({"chain": 3, "time": 600}, "slurm")
    run = tmp_path / "run"
    batch = plan_batch(spec, load_profile("slurm"), RunPaths("r1", run, run / "ckpt"), tmp_path)
    script = batch.script
    assert "HPCLAUNCH_ATTEMPT=${1:-0}" in script
    assert "#SBATCH --kill-on-invalid-dep=yes" in script
    assert "--dependency" not in script and "#SBATCH --requeue" not in script
    assert f"<{run}/chain.jobs" in script and 'scancel "${HPCLAUNCH_LATER[@]}"' in script
    assert '/logs/attempt-"${HPCLAUNCH_ATTEMPT}"' in script
    path = tmp_path / "job.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    shown = preview(batch, {})
    assert f"sbatch --parsable {run}/job.sh 0\n" in shown
    assert f"'--dependency=afterany:<job id of 1>' {run}/job.sh 2\n" in shown


def test_dependency_directive(tmp_path: Path) -> None:
    from dataclasses import replace

    spec = replace(cli_spec({"time": 600}, "slurm"), dependency="afterok:11")
    run = tmp_path / "run"
    script = plan_batch(
        spec, load_profile("slurm"), RunPaths("r1", run, run / "c"), tmp_path
    ).script
    assert "#SBATCH --dependency=afterok:11\n#SBATCH --kill-on-invalid-dep=yes\n" in script


def _st(state: str) -> JobStatus:
    return JobStatus(state, "", None)


def test_chain_status() -> None:
    ids = ["1", "2", "3"]
    pending = {"1": _st("COMPLETED"), "2": _st("RUNNING"), "3": _st("PENDING")}
    assert chain_status(ids, pending, [0, 1]) == _st("RUNNING")
    waiting = {"1": _st("COMPLETED"), "2": _st("PENDING"), "3": _st("PENDING")}
    assert chain_status(ids, waiting, [0]) == _st("PENDING")
    # Member 1 wrote the done marker and cancelled member 2: the chain COMPLETED.
    done = {"1": _st("TIMEOUT"), "2": _st("COMPLETED"), "3": _st("CANCELLED")}
    assert chain_status(ids, done, [0, 1]) == _st("COMPLETED")
    assert chain_status(ids, {}, []) is None


def _record(run_dir: Path, **fields: Any) -> RunRecord:
    run_dir.mkdir(parents=True)
    runrecord.create(run_dir, {"run_id": run_dir.name, "run_dir": str(run_dir),
                             "backend": "slurm", **fields})  # fmt: skip
    return runrecord.load(run_dir)


def test_a_dependency_not_submitted_yet_has_not_ended(tmp_path: Path) -> None:
    """A run waited for that is still CREATED (its launch not answered yet) is open
    (states.is_open): no "never started ... it ended CREATED" reason is made up for the run
    that waits; one that ended FAILED gives it. Nothing here asks Slurm: no job ids."""
    dep = _record(tmp_path / "dep", state="CREATED")
    after = {"job_ids": ["11"], "run_dir": dep.run_dir, "condition": "ok"}
    waiting = _record(tmp_path / "waiting", state="CANCELLED", after=[after])
    assert why_never_started(waiting) is None
    runrecord.update(Path(dep.run_dir), state="FAILED")
    assert why_never_started(waiting) == "never started: --after dep:ok, and it ended FAILED"
