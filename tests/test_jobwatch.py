"""The GPU watch in a batch job (jobwatch.py, scriptend.py): when a run has one, the
script lines that start it beside the ranks and stop it after them, and the files it
ships. The watch on the testbed: tests/test_e2e_gpu_watch.py."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from builders import cli_spec
from hpclaunch import node
from hpclaunch.config.profiles import load_profile
from hpclaunch.errors import UserError
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import gpu_watch_lines
from hpclaunch.script.render import plan_batch

LUMI = {"partition": "small-g", "account": "project_465000000", "time": 600}
_spec = partial(cli_spec, lumi_run=LUMI)  # on LUMI its runs ask for 10 minutes


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def _script(tmp_path: Path, values: Mapping[str, Any]) -> str:
    run = tmp_path / "run"
    paths = RunPaths("r1", run, run / "checkpoints")
    return plan_batch(_spec(values), load_profile("lumi"), paths, tmp_path).script


def test_on_by_default_for_gpu_jobs_only() -> None:
    assert _spec({}).watch_interval_s == gpu_watch_lines.DEFAULT_INTERVAL_S  # small-g: 1 GCD
    assert _spec({"watch_interval": 5.0}).watch_interval_s == 5.0
    assert _spec({"no_watch": True}).watch_interval_s == 0.0
    assert _spec({"no_watch": True, "watch_interval": 5.0}).watch_interval_s == 0.0
    assert _spec({"gpus_per_node": 0}).watch_interval_s == 0.0  # no GPUs asked
    assert _spec({"gpus_per_node": 1}, step=True).watch_interval_s == 2.0  # a step: started too
    assert _spec({}, cluster="local").watch_interval_s == 0.0  # local: no GPUs, no watch


@pytest.mark.parametrize("seconds", [0.1, 0.0, -1.0, 601.0])
def test_an_interval_out_of_range_is_one_line(seconds: float) -> None:
    with pytest.raises(UserError) as info:
        _spec({"watch_interval": seconds})
    line = info.value.line()
    assert line.startswith("hpclaunch: error: --watch-interval:") and "0.5 to 600" in line
    assert "\n" not in line


def test_the_watch_starts_after_the_ranks_and_stops_before_the_script_ends(
    tmp_path: Path,
) -> None:
    script = _script(tmp_path, {})
    lines = script.splitlines()
    ranks = next(i for i, line in enumerate(lines) if line.endswith("python t.py &"))
    start = next(i for i, line in enumerate(lines) if line.startswith("{ sleep 1; exec srun"))
    wait = lines.index('wait "$HPCLAUNCH_STEP_PID"')
    stop = lines.index('    kill -USR1 "$HPCLAUNCH_WATCH_PID" 2>/dev/null')
    assert ranks < start < wait < stop < lines.index('exit "$HPCLAUNCH_RC"')
    watch = lines[start]
    for word in ("--overlap", "--ntasks-per-node=1", "--cpus-per-task=1", "--warn"):
        assert word in watch, watch
    assert f"{tmp_path}/run/gpu_watch.py" in watch and "--interval 2 " in watch, watch
    assert f"'{tmp_path}/run/metrics/gpu-{{node}}.csv'" in watch, watch
    assert '".gpu-watch-stop-${SLURM_JOB_ID}"' in script  # no attempt without --requeue
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_a_requeued_run_has_a_stop_file_per_attempt(tmp_path: Path) -> None:
    script = _script(tmp_path, {"requeue": True, "signal_before": 90})
    assert '".gpu-watch-stop-${SLURM_JOB_ID}-${HPCLAUNCH_ATTEMPT}"' in script
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("{ sleep 1; exec srun"))
    assert lines[start - 6] == "HPCLAUNCH_STEP_PID=$!", lines[start - 6 : start + 1]
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_no_watch_leaves_the_script_as_it_was(tmp_path: Path) -> None:
    script = _script(tmp_path, {"no_watch": True})
    assert "HPCLAUNCH_WATCH" not in script and "gpu_watch.py" not in script
    assert "&\n" not in script  # the ranks' step in the foreground, as before
    assert plan_batch(_spec({"no_watch": True}), load_profile("lumi"), _paths(tmp_path), tmp_path)


def _paths(tmp_path: Path) -> RunPaths:
    return RunPaths("r1", tmp_path / "run", tmp_path / "run" / "checkpoints")


def test_the_plan_carries_the_watch_for_a_step_and_the_files_to_ship(tmp_path: Path) -> None:
    spec = _spec({"gpus_per_node": 1}, step=True)
    batch = plan_batch(spec, load_profile("lumi"), _paths(tmp_path), tmp_path)
    assert batch.watch_argv[:2] == ("srun", "--overlap"), batch.watch_argv
    assert node.shipped(False, True) == [node.LOADER, node.BOOTSTRAP, node.GPU_WATCH]
    assert node.shipped(True, False) == [node.LOADER, node.BOOTSTRAP, node.STAGE_GUARD]
    assert not plan_batch(
        _spec({"no_watch": True}), load_profile("lumi"), _paths(tmp_path), tmp_path
    ).watch_argv
