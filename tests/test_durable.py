"""Records on file systems that refuse flock or run full (issue 25, items 1, 2 and 5):
run.json updates through a lock file where flock fails, stale lock files are broken, a
record's failed write keeps the last good state and leaves nothing aside, an index line
cut short by a full disk is taken back, and a local run whose launcher pid now belongs
to another user reads as ended."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import multiprocessing
import os
import pwd
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import testbed
from hpclaunch.records import index, locking, runrecord
from sweeptools import trial_rows

NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)


def _failing_flock(code: int) -> object:
    def flock(fd: int, operation: int) -> None:
        raise OSError(code, os.strerror(code))

    return flock


@pytest.mark.parametrize("code", NO_FLOCK, ids=[errno.errorcode[c] for c in NO_FLOCK])
def test_records_update_without_flock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    monkeypatch.setattr(fcntl, "flock", _failing_flock(code))
    runrecord.create(tmp_path, {"run_id": "r", "state": "CREATED"})
    stored = runrecord.update(tmp_path, state="RUNNING", job_id="7")
    assert stored["state"] == "RUNNING"
    assert runrecord.load(tmp_path).job_id == "7"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no lock file left


def test_other_flock_errors_still_raise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fcntl, "flock", _failing_flock(errno.EBADF))
    runrecord.create(tmp_path, {"run_id": "r"})
    with pytest.raises(OSError):
        runrecord.update(tmp_path, state="RUNNING")


def test_the_optuna_journal_needs_no_flock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Optuna's JournalFileBackend locks with a symlink (JournalFileSymlinkLock), never
    flock: where flock fails, the sweep's journal works as it is."""
    pytest.importorskip("optuna")
    from hpclaunch.sweeps import trials
    from hpclaunch.sweeps.space import SpaceParam

    monkeypatch.setattr(fcntl, "flock", _failing_flock(errno.ENOLCK))
    space = (SpaceParam("x", "float", low=-5.0, high=5.0),)
    trials.create_study(tmp_path, "sw", "minimize")
    for point in range(3):
        _, params = trials.ask(tmp_path, "sw", space, point, f"9_{point}", lambda p: set(p))
        loss = (float(str(params["x"])) - 2) ** 2
        assert trials.tell(tmp_path, "sw", point, 0, {"loss": loss}, "loss") == "COMPLETE"
    assert [r["state"] for r in trial_rows(tmp_path, "sw")] == ["COMPLETE"] * 3


def test_a_sweep_folder_without_symlinks_uses_optunas_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("optuna")
    from optuna.storages.journal import JournalFileOpenLock

    from hpclaunch.sweeps import trials
    from hpclaunch.sweeps.space import SpaceParam

    def no_symlink(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "symlink", no_symlink)
    monkeypatch.setattr(fcntl, "flock", _failing_flock(errno.ENOLCK))
    trials.create_study(tmp_path, "sw", "maximize")
    assert (tmp_path / trials.OPEN_LOCK).exists()
    backend = trials.storage(tmp_path)._backend  # type: ignore[attr-defined]
    assert isinstance(backend._lock, JournalFileOpenLock)
    space = (SpaceParam("x", "float", low=0.0, high=1.0),)
    _, params = trials.ask(tmp_path, "sw", space, 0, "9_0", lambda p: set(p))
    assert trials.tell(tmp_path, "sw", 0, 0, {"m": params["x"]}, "m") == "COMPLETE"


def _count_up(folder: str, times: int) -> None:
    fcntl.flock = _failing_flock(errno.ENOLCK)  # type: ignore[assignment]
    for _ in range(times):
        with runrecord._locked(Path(folder)):
            data = runrecord.read_raw(Path(folder))
            data["count"] = data.get("count", 0) + 1
            runrecord.write_json(Path(folder) / "run.json", data)


def test_lock_file_serialises_writers_of_several_processes(tmp_path: Path) -> None:
    runrecord.create(tmp_path, {"run_id": "r", "count": 0})
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_count_up, args=(str(tmp_path), 40)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert runrecord.read_raw(tmp_path)["count"] == 160  # no update lost


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _plant(folder: Path, text: str, age: float = 0.0) -> Path:
    lock = folder / locking.LOCK_FILE
    lock.write_text(text)
    if age:
        when = time.time() - age
        os.utime(lock, (when, when))
    return lock


def test_a_lock_file_of_a_dead_process_is_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fcntl, "flock", _failing_flock(errno.ENOLCK))
    runrecord.create(tmp_path, {"run_id": "r"})
    _plant(tmp_path, f"{socket.gethostname()} {_dead_pid()} 1.0 {uuid.uuid4().hex}\n")
    runrecord.update(tmp_path, state="RUNNING")
    assert runrecord.read_raw(tmp_path)["state"] == "RUNNING"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_lock_file_of_a_reused_pid_is_broken(tmp_path: Path) -> None:
    # This process's pid with another start time: the holder died, its pid came back.
    _plant(tmp_path, f"{socket.gethostname()} {os.getpid()} 3.5 {uuid.uuid4().hex}\n")
    with locking.lock_file(tmp_path / locking.LOCK_FILE, wait_s=5):
        pass
    assert not (tmp_path / locking.LOCK_FILE).exists()


def test_a_live_holder_is_waited_for(tmp_path: Path) -> None:
    me = os.getpid()
    _plant(tmp_path, f"{socket.gethostname()} {me} {locking.process_start(me)} x\n")
    started = time.monotonic()
    with (
        pytest.raises(locking.LockTimeout, match="Remove it if no hpclaunch"),
        locking.lock_file(tmp_path / locking.LOCK_FILE, wait_s=0.3),
    ):
        pass
    assert time.monotonic() - started >= 0.3
    assert (tmp_path / locking.LOCK_FILE).exists()  # a live holder's lock stays


def test_another_hosts_lock_is_stale_by_its_age(tmp_path: Path) -> None:
    lock = tmp_path / locking.LOCK_FILE
    _plant(tmp_path, "elsewhere 123 4.0 x\n")
    with (
        pytest.raises(locking.LockTimeout),
        locking.lock_file(lock, wait_s=0.2),
    ):
        pass
    _plant(tmp_path, "elsewhere 123 4.0 x\n", age=locking.STALE_AFTER_S + 5)
    with locking.lock_file(lock, wait_s=5):
        assert f" {os.getpid()} " in lock.read_text()
    assert not lock.exists()


# A full disk: a small tmpfs (the tests run as root), filled to the last byte.


def small_tmpfs(size: str = "256k") -> contextlib.AbstractContextManager[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    return testbed.small_tmpfs(size)


fill = testbed.fill


def test_a_record_write_on_a_full_disk_keeps_the_last_good_state() -> None:
    with small_tmpfs() as mount:
        run = mount / "run"
        run.mkdir()
        runrecord.create(run, {"run_id": "r", "state": "RUNNING", "job_id": "5"})
        before = (run / "run.json").read_bytes()
        filler = fill(mount)
        with pytest.raises(OSError) as caught:
            runrecord.update(run, state="COMPLETED", exit_code=0, reason="x" * 8192)
        assert caught.value.errno == errno.ENOSPC
        assert (run / "run.json").read_bytes() == before
        assert sorted(p.name for p in run.iterdir()) == ["run.json"]  # no .tmp left
        filler.unlink()
        runrecord.update(run, state="COMPLETED", exit_code=0)
        assert runrecord.load(run).state == "COMPLETED"


def test_an_index_line_cut_short_is_taken_back() -> None:
    with small_tmpfs() as mount:
        env = {"XDG_DATA_HOME": str(mount)}
        index.add({"run_id": "run-a", "run_dir": "/a", "job_id": "1"}, env)
        size = index.path(env).stat().st_size
        filler = fill(mount)  # the index's last page still has room for a part of a line
        with pytest.raises(OSError) as caught:
            index.add({"run_id": "run-b", "run_dir": "/b", "pad": "p" * 8000}, env)
        assert caught.value.errno == errno.ENOSPC
        assert index.path(env).stat().st_size == size  # the cut line is gone
        filler.unlink()
        index.add({"run_id": "run-c", "run_dir": "/c", "job_id": "3"}, env)
        listing = index.read(env)
        assert [e["run_id"] for e in listing.entries] == ["run-c", "run-a"]
        assert not listing.skipped


def test_a_job_accepted_on_a_full_disk_is_a_warning_naming_job_folder_and_fix() -> None:
    from hpclaunch import launching
    from hpclaunch.records import runpaths

    with small_tmpfs() as mount:
        run_dir = mount / "runs" / "default" / "r1"
        run_dir.mkdir(parents=True)
        runrecord.create(run_dir, {"run_id": "r1", "state": "CREATED"})
        env = {"XDG_DATA_HOME": str(mount / "xdg")}
        req = launching.LaunchRequest({}, ("true",), mount, env)
        paths = runpaths.RunPaths("r1", run_dir, run_dir / "checkpoints")
        filler = fill(mount)
        entry = {"run_id": "r1", "run_dir": str(run_dir), "job_id": "4242", "pad": "p" * 8000}
        notes = launching._record_accepted(req, paths, "4242", {"state": "PENDING"}, entry)
        assert len(notes) == 2, notes
        assert all("4242" in note and str(run_dir) in note for note in notes)
        assert "scancel 4242" in notes[0] and "free space" in notes[0].lower()
        assert runrecord.read_raw(run_dir)["state"] == "CREATED"  # the last good state
        filler.unlink()


# Item 5: a local run's launcher pid that now belongs to another user.


def _as_user(user: str, code: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(runrecord.__file__).parents[1])}
    proc = subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
         sys.executable, "-c", code],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_launcher_pid_of_another_user_is_no_sign_of_life() -> None:
    try:
        pwd.getpwnam("hpcuser"), pwd.getpwnam("hpcother")
    except KeyError:
        pytest.skip("needs the testbed's users hpcuser and hpcother")
    if os.geteuid() != 0:
        pytest.skip("starting another user's process needs root")
    other = subprocess.Popen(["runuser", "-u", "hpcother", "--", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        pid = other.pid
        while time.monotonic() < deadline:  # runuser's child: the sleep itself
            children = Path(f"/proc/{other.pid}/task/{other.pid}/children").read_text().split()
            if children:
                pid = int(children[0])
                break
            time.sleep(0.05)
        started = locking.process_start(pid)  # the worst case: even the start time matches
        code = (
            "from hpclaunch.backends.localreaper import launcher_alive, launcher_gone;"
            f"print(launcher_alive({pid}, {started}), launcher_gone({pid}, {started}))"
        )
        said = _as_user("hpcuser", code)
        assert said.startswith("False"), said
        assert "another user" in said
    finally:
        other.kill()
        other.wait()
