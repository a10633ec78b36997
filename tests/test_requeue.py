"""--requeue without Slurm: the refusals, the batch script's text (bash -n), the attempts
folded from events, the per-attempt folders. The behaviour itself (signal, requeue,
resume) is shown on the testbed by tests/test_e2e_requeue.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from builders import ENV, cli_spec
from hpclaunch.config.jobspec import Requeue
from hpclaunch.config.profiles import load_profile
from hpclaunch.errors import UserError
from hpclaunch.node import stage_guard
from hpclaunch.records import runrecord
from hpclaunch.records.attempts import Attempt, fold, summary
from hpclaunch.records.runpaths import RunPaths, attempt_numbers, rank_logs
from hpclaunch.script import requeue
from hpclaunch.script.render import plan_batch


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def _error(values: Mapping[str, Any], cluster: str = "lumi", step: bool = False) -> str:
    with pytest.raises(UserError) as info:
        cli_spec(values, cluster, step)
    return info.value.line()


def test_defaults() -> None:
    spec = cli_spec({"requeue": True, "time": 3600})
    assert spec.requeue == Requeue(max_requeues=3, signal="USR2", before_s=120, margin_s=15)
    assert cli_spec({"time": 3600}).requeue is None


@pytest.mark.parametrize(
    ("values", "cluster", "step", "expected"),
    [
        ({"requeue": True}, "local", False, "--requeue: not for a local run"),
        ({"requeue": True}, "lumi", True, "--requeue: not for a step of the current allocation"),
        ({"max_requeues": 2}, "lumi", False, "--max-requeues: given without --requeue"),
        ({"signal_before": 60}, "lumi", False, "--signal-before: given without --requeue"),
        (
            {"requeue": True, "time": 60, "signal_before": 120},
            "lumi",
            False,
            "--signal-before: 120 s with a time limit of 00:01:00 (must be below the time limit)",
        ),
        (
            {"requeue": True, "time": 60, "signal_before": 30},
            "lumi",
            False,
            "--signal-before: 30 s with a time limit of 00:01:00 (at most the time limit minus 31",
        ),
        ({"requeue": True, "signal_before": 10}, "lumi", False, "--signal-before: 10 s (more"),
        ({"requeue": True, "max_requeues": -1}, "lumi", False, "--max-requeues: -1 (0 to 1000)"),
        ({"sbatch_arg": ("--signal=B:USR1@60",)}, "lumi", False, "is modelled by hpclaunch"),
        ({"sbatch_arg": ("--requeue",)}, "lumi", False, "Use hpclaunch's --requeue instead"),
    ],
)
def test_refusals(values: dict[str, Any], cluster: str, step: bool, expected: str) -> None:
    text = _error(values, cluster, step)
    assert expected in text, text
    assert "\n" not in text


@pytest.mark.parametrize(
    ("time_s", "before", "fix"),
    [
        (60, 30, "Give at most 29 s, or a longer -t"),  # it said 16: 29 is accepted
        (60, 120, "Give at most 29 s, or a longer -t"),
        (3600, 3590, "Give at most 3569 s, or a longer -t"),
    ],
)
def test_the_fix_names_the_largest_signal_before_accepted(
    time_s: int, before: int, fix: str
) -> None:
    text = _error({"requeue": True, "time": time_s, "signal_before": before}, "lumi", False)
    assert text.endswith(fix), text
    largest = int(fix.split()[3])  # and that value is accepted
    assert cli_spec({"requeue": True, "time": time_s, "signal_before": largest}).requeue


def test_cli_refuses_requeue_locally_before_anything_is_written(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["hpclaunch", "run", "--cluster", "local", "--requeue", "--", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={**ENV, "PATH": str(Path(__import__("sys").executable).parent) + ":/usr/bin:/bin"},
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("hpclaunch: error: --requeue: not for a local run")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def _script(tmp_path: Path, values: Mapping[str, Any]) -> str:
    spec = cli_spec({"time": 600, **values})
    run = tmp_path / "run"
    paths = RunPaths("r1", run, run / "checkpoints")
    return plan_batch(spec, load_profile("lumi"), paths, tmp_path).script


def test_script_asks_slurm_for_the_signal_and_is_valid_bash(tmp_path: Path) -> None:
    script = _script(tmp_path, {"requeue": True, "signal_before": 90, "max_requeues": 5})
    assert "#SBATCH --requeue\n" in script
    assert "#SBATCH --signal=B:USR2@90\n" in script
    assert "#SBATCH --open-mode=append\n" in script
    # The ranks' step in the background (so the trap runs), the ranks' logs per attempt.
    assert "trap hpclaunch_on_signal USR2" in script
    assert 'kill -USR2 "$HPCLAUNCH_STEP_PID"' in script
    assert '/logs/attempt-"${HPCLAUNCH_ATTEMPT}"' in script
    assert 'scontrol requeue "$HPCLAUNCH_REQUEUE_ID"' in script
    # An array task by <array>_<task>, never by the array's id (which is the last task's).
    assert 'HPCLAUNCH_REQUEUE_ID="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in script
    assert "(( HPCLAUNCH_ATTEMPT >= 5 ))" in script
    assert "they have 75 s to save and exit" in script
    path = tmp_path / "job.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_without_requeue_the_script_is_unchanged(tmp_path: Path) -> None:
    script = _script(tmp_path, {})
    assert "#SBATCH --signal" not in script and "#SBATCH --requeue" not in script
    assert "scontrol requeue" not in script
    assert "HPCLAUNCH_ATTEMPT" not in script


def test_staged_requeue_names_the_local_folder_by_attempt() -> None:
    assert stage_guard.local_tag({"SLURM_JOB_ID": "7", "HPCLAUNCH_ATTEMPT": "2"}) == "7-a2"
    assert stage_guard.local_tag({"SLURM_JOB_ID": "7"}) == "7"


def test_stage_guard_removes_earlier_attempts_of_its_own_job(tmp_path: Path) -> None:
    for name in ("hpclaunch-7-a0.x1", "hpclaunch-7-a1.x2", "hpclaunch-7.x3"):
        (tmp_path / name).mkdir()
    found = stage_guard.leftovers(str(tmp_path), "7-a1")
    assert sorted(Path(p).name for p in found) == ["hpclaunch-7-a0.x1", "hpclaunch-7.x3"]
    # A run without --requeue keeps the old rule: its own job's folder is never a leftover.
    found = stage_guard.leftovers(str(tmp_path), "7")
    assert sorted(Path(p).name for p in found) == ["hpclaunch-7-a0.x1", "hpclaunch-7-a1.x2"]


def _events(run_dir: Path, lines: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(line) + "\n" for line in lines) + '{"event": "cut sh'
    (run_dir / "events.jsonl").write_text(text)


def test_attempts_are_folded_and_described(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r1", "state": "COMPLETED"}))

    def ev(kind: str, attempt: int, when: float, **fields: Any) -> dict[str, Any]:
        return {"event": kind, "attempt": attempt, "time": when, **fields}

    rank = {"rank": 0, "node": "n1"}
    _events(
        tmp_path,
        [
            ev("attempt_start", 0, 1, job_id="5", nodes="n[1-2]"),
            ev("rank_start", 0, 1, pid=9, **rank),
            ev("rank_end", 0, 2, returncode=3, **rank),
            ev("attempt_end", 0, 3, reason="requeued", why="time-limit", exit_code=0),
            # Attempt 1 has no end of its own: Slurm requeued the job itself.
            ev("attempt_start", 1, 4, job_id="5", nodes="n3"),
            ev("attempt_start", 2, 6, job_id="5", nodes="n1"),
            ev("rank_start", 2, 6, pid=9, **rank),
            ev("rank_end", 2, 8, returncode=0, **rank),
            ev("attempt_end", 2, 9, reason="ended", exit_code=0),
        ],
    )
    record = runrecord.load(tmp_path)
    tried = record.events.attempts
    assert [a.number for a in tried] == [0, 1, 2]
    assert [a.describe(a is tried[-1]) for a in tried] == [
        "requeued by hpclaunch (time limit)",
        "requeued by Slurm",
        "ended",
    ]
    # The ranks' facts are the last attempt's: attempt 0's failed rank does not count.
    assert record.events.first_failure is None
    assert record.events.first_start == 6
    assert record.to_dict()["attempts"][1]["ended"] == "requeued by Slurm"
    assert (
        summary(tried)[0]
        == "attempt 0: job 5 on n[1-2]: requeued by hpclaunch (time limit), exit 0"
    )


def test_records_without_attempts_have_none(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r1"}))
    assert runrecord.load(tmp_path).events.attempts == []
    assert "attempts" not in runrecord.load(tmp_path).to_dict()


def test_budget_and_preemption_are_said() -> None:
    budget = Attempt(1, reason=requeue.BUDGET, why="time-limit")
    assert budget.describe(last=True) == "stopped: the requeue budget is spent (time limit)"
    preempted = Attempt(0, reason=requeue.REQUEUED, why="preempted")
    assert preempted.describe(last=False) == "requeued by hpclaunch (preempted)"
    assert fold([{"event": "attempt_end", "attempt": "x"}]) == []


def test_rank_logs_follow_the_latest_attempt(tmp_path: Path) -> None:
    assert rank_logs(tmp_path) == tmp_path / "logs"
    for n in (0, 2, 10):
        (tmp_path / "logs" / f"attempt-{n}").mkdir(parents=True)
    (tmp_path / "logs" / "attempt-x").mkdir()
    assert attempt_numbers(tmp_path) == [0, 2, 10]
    assert rank_logs(tmp_path) == tmp_path / "logs" / "attempt-10"
    assert rank_logs(tmp_path, 2) == tmp_path / "logs" / "attempt-2"


@pytest.mark.parametrize("budget_end_recorded", [True, False])
def test_a_spent_budget_is_named_whether_or_not_the_shell_recorded_it(
    tmp_path: Path, budget_end_recorded: bool
) -> None:
    """Under load, Slurm's time limit can end the job before its batch shell writes the
    budget's end: `status` says the same sentence either way (it said two before)."""
    from hpclaunch.cli import reporting

    end = {"reason": requeue.BUDGET, "why": "time-limit"} if budget_end_recorded else {}
    events = [
        {"event": "attempt_start", "attempt": 0, "time": 1.0, "job_id": "7"},
        {"event": "attempt_end", "attempt": 0, "time": 2.0, "reason": "requeued"},
        {"event": "attempt_start", "attempt": 1, "time": 3.0, "job_id": "7"},
    ]
    if end:
        events.append({"event": "attempt_end", "attempt": 1, "time": 4.0, **end})
    record = runrecord.from_dict(
        {"run_id": "r", "state": "TIMEOUT", "exit_code": 124, "options": {"max_requeues": 1}},
        tmp_path,
    )
    _events(tmp_path, events)
    record.events = runrecord.read_events(tmp_path)
    line = reporting.summary(record)
    assert "2 attempts" in line, line
    assert "the requeue budget (--max-requeues 1) is spent" in line, line
