"""What hpclaunch reads from Slurm's answers, on answers recorded from the testbed's real
Slurm 22.05 (tests/data/slurm-22.05, replayed by tests/slurm_replay.py): parsing and the
decisions taken on it, in-process, without starting a job.

The same behaviours on the real testbed: the states of a sweep's tasks and of an ended
job (tests/test_e2e_sweep.py, tests/test_e2e_lifecycle.py), the doctor's node check
(tests/test_e2e_doctor.py), attach's node (tests/test_e2e_attach.py), the partitions'
limits (tests/test_e2e_slurm_flags.py and every run's validation)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from hpclaunch.backends import slurm
from hpclaunch.backends.slurm import SlurmBackend
from hpclaunch.doctor import checks
from hpclaunch.errors import SlurmError
from hpclaunch.observe import attach
from hpclaunch.slurm import discover
from hpclaunch.sweeps import arrays, limits
from slurm_replay import SlurmReplay, recorded


@pytest.fixture(autouse=True)
def _fresh_memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Nothing learnt from Slurm before the test (sacct's mode, tasks' ids, the cached
    configuration and partitions) and nothing kept after it."""
    monkeypatch.setattr(slurm._Memory, "sacct_mode", None)
    monkeypatch.setattr(slurm._Memory, "own_ids", {})
    # slurm_config asks only where sbatch exists; the replay stands in for it.
    real_which = shutil.which
    monkeypatch.setattr(
        discover.shutil,
        "which",
        lambda name, *a, **k: name if name == "sbatch" else real_which(name),
    )
    discover.slurm_config.cache_clear()
    discover.partitions.cache_clear()
    yield
    discover.slurm_config.cache_clear()
    discover.partitions.cache_clear()


def _rows(name: str) -> list[list[str]]:
    return [line.split("|") for line in recorded(name).stdout.splitlines()]


def test_array_tasks_held_throttled_and_running_from_one_squeue(slurm_replay: SlurmReplay) -> None:
    slurm_replay.answer("squeue_tasks")
    rows = _rows("squeue_tasks")  # %F|%K|%A|%T|%r
    plain = [r for r in rows if r[1] == "N/A"]
    tasks = [r for r in rows if r[1] != "N/A"]
    asked = [r[0] for r in plain] + [f"{r[0]}_{r[1]}" for r in tasks]
    found = SlurmBackend().status(asked)
    assert slurm_replay.calls == [list(recorded("squeue_tasks").argv)]  # one squeue, no more
    by_reason = sorted((found[key].state, found[key].reason) for key in asked)
    assert by_reason == sorted(
        (row[3], "" if row[4] == "None" else row[4]) for row in plain + tasks
    ), found
    assert ("PENDING", "JobArrayTaskLimit") in by_reason  # the throttle (%1)
    assert ("PENDING", "JobHeldUser") in by_reason  # scontrol hold
    # A task that has its own job id (%A) is known by it afterwards (sacct -c asks by it).
    own = {f"{r[0]}_{r[1]}": r[2] for r in tasks if r[2] != r[0]}
    assert own and all(slurm._Memory.own_ids[key] == value for key, value in own.items())


def test_an_ended_job_is_asked_of_the_completion_file_when_no_database_answers(
    slurm_replay: SlurmReplay,
) -> None:
    slurm_replay.answer("squeue_ended", "sacct_database", "sacct_jobcomp")
    job = recorded("squeue_ended").argv[-1]
    backend = SlurmBackend()
    found = backend.status([job])
    assert (found[job].state, found[job].exit_code) == ("FAILED", "3:0"), found
    # squeue -t all still lists it (MinJobAge), but as ended: accounting gives the code.
    # The database first ("Slurm accounting storage is disabled"), then sacct -c ...
    assert [c[:2] for c in slurm_replay.calls] == [
        ["squeue", "-r"], ["sacct", "-X"], ["sacct", "-c"]
    ]  # fmt: skip
    # ... which is what this process asks first from then on.
    slurm_replay.calls.clear()
    assert SlurmBackend().status([job])[job].state == "FAILED"
    assert [c[:2] for c in slurm_replay.calls] == [["squeue", "-r"], ["sacct", "-c"]]


def test_the_site_has_no_accounting_database(slurm_replay: SlurmReplay) -> None:
    slurm_replay.answer("scontrol_show_config")
    assert slurm.site_sacct_mode() == "-c"  # AccountingStorageType = accounting_storage/none
    max_array, max_jobs = arrays.limits_from_config(discover.slurm_config() or {})
    assert (max_array, max_jobs) == (1001, 10000)  # the testbed sets neither: the defaults


def test_a_refused_command_is_slurms_own_reason(slurm_replay: SlurmReplay) -> None:
    slurm_replay.answer("squeue_tasks_forgotten", "sacctmgr_assoc")
    with pytest.raises(SlurmError, match="Invalid job id specified"):
        slurm_replay.run(recorded("squeue_tasks_forgotten").argv)
    # No database: sacctmgr fails, so no MaxSubmitJobs is known (not a made-up one).
    assert slurm_replay.query(arrays.sacctmgr_argv("hpcuser")) is None


def test_live_jobs_are_sdiags_pending_and_running(slurm_replay: SlurmReplay) -> None:
    slurm_replay.answer("sdiag")
    text = recorded("sdiag").stdout
    counts = {
        key.strip(): int(value)
        for key, _, value in (line.partition(":") for line in text.splitlines())
        if key.strip() in ("Jobs pending", "Jobs running")
    }
    assert limits.live_jobs(text) == counts["Jobs pending"] + counts["Jobs running"]
    held, note = limits.queued_jobs(arrays.SiteLimits(1001, 10, None), "hpcuser", 9)
    assert (held, note) == (counts["Jobs pending"] + counts["Jobs running"], "")


def test_node_states_once_per_node_without_flags(slurm_replay: SlurmReplay) -> None:
    slurm_replay.answer("sinfo_nodes")
    nodes = checks.node_states("")
    assert [n.name for n in nodes] == ["node1", "node2"]  # sinfo -N: a row per partition
    assert all(n.gpus == 2 for n in nodes)
    recorded_states = {row[0]: row[1].rstrip("*~#!%$@^-+") for row in _rows("sinfo_nodes")}
    assert {n.name: n.state for n in nodes} == recorded_states


def test_partitions_and_their_limits(slurm_replay: SlurmReplay) -> None:
    slurm_replay.answer("sinfo_partitions")
    found = discover.partitions()
    assert sorted(found) == ["debug", "short"]
    assert found["debug"].default and not found["short"].default
    assert found["short"].max_time == 60 and found["debug"].max_time is None
    assert (found["debug"].nodes, found["debug"].cpus, found["debug"].gpus) == (2, 2, 2)
    assert found["debug"].memory_mb == 8000


def test_attach_finds_the_jobs_node(slurm_replay: SlurmReplay) -> None:
    slurm_replay.answer("squeue_nodes_of_job", "scontrol_hostnames")
    job = recorded("squeue_nodes_of_job").argv[3]
    own, nodes = attach.ask_slurm(job)
    assert own == job and nodes == recorded("scontrol_hostnames").stdout.split()


def test_a_command_not_recorded_fails_the_test(slurm_replay: SlurmReplay) -> None:
    with pytest.raises(AssertionError, match="no recorded answer"):
        slurm_replay.run(["squeue", "--me"])
