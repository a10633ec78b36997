"""monitor.py: log following on real files, exit codes, and the wait loop with a scripted
status source (Slurm itself is exercised by the testbed tests)."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpclaunch.basics import states
from hpclaunch.observe.jobend import (
    EXIT_OTHER_FAILURE,
    EXIT_UNKNOWN,
    JobStatus,
    first_failure,
    job_exit_code,
    wait_and_stream,
)
from hpclaunch.observe.logs import LogFollower


def append(path: Path, data: bytes | str) -> None:
    with open(path, "ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def register(logs: Path, rank: int, node: str) -> None:
    append(logs / "ranks.tsv", f"{rank}\t{node}\t0\t{1000 + rank}\n")


def exit_file(logs: Path, rank: int, returncode: int, when: float) -> None:
    record = {"rank": rank, "node": "n", "returncode": returncode, "time": when}
    (logs / f"rank-{rank}.exit").write_text(json.dumps(record))


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    d.mkdir()
    return d


def follower(logs: Path, **kw: object) -> tuple[LogFollower, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return LogFollower(logs, out, err, **kw), out, err  # type: ignore[arg-type]


# --- LogFollower -------------------------------------------------------------------------


def test_interleaved_partial_lines(logs: Path) -> None:
    register(logs, 0, "n0")
    register(logs, 1, "n1")
    f, out, err = follower(logs)
    append(logs / "rank-0.out", "hel")
    append(logs / "rank-1.out", "wor")
    append(logs / "rank-1.err", "oops")
    assert f.poll() == 0
    assert out.getvalue() == "" and err.getvalue() == ""
    append(logs / "rank-0.out", "lo\nsecond")
    append(logs / "rank-1.out", "ld\n")
    append(logs / "rank-1.err", " 1\n")
    assert f.poll() == 3
    assert out.getvalue() == "[n0 0] hello\n[n1 1] world\n"
    assert err.getvalue() == "[n1 1] oops 1\n"
    append(logs / "rank-0.out", " line\nlast without newline")
    assert f.poll() == 1
    assert f.drain() == 1
    assert out.getvalue().splitlines()[2:] == ["[n0 0] second line", "[n0 0] last without newline"]
    assert f.poll() == 0 and f.drain() == 0  # nothing printed twice


def test_rank_file_and_node_appear_late(logs: Path) -> None:
    f, out, _ = follower(logs)
    assert f.poll() == 0
    append(logs / "rank-7.out", "early\n")
    assert f.poll() == 1
    register(logs, 7, "nid001")
    append(logs / "rank-7.out", "late\n")
    assert f.poll() == 1
    assert out.getvalue() == "[? 7] early\n[nid001 7] late\n"
    assert f.nodes == {7: "nid001"}


def test_log_dir_appears_late(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    f, _, _ = follower(logs)
    assert f.poll() == 0
    logs.mkdir()
    append(logs / "rank-0.out", "x\n")
    assert f.poll() == 1


def test_non_utf8_bytes_and_ascii_stream(logs: Path) -> None:
    append(logs / "rank-0.out", b"ok \xff\xfe bytes \xc3\n")
    f, out, _ = follower(logs, tag=False)
    assert f.poll() == 1
    assert out.getvalue() == "ok \ufffd\ufffd bytes \ufffd\n"
    # A stream that cannot encode the replacement character (an ASCII locale) still works.
    raw = io.BytesIO()
    ascii_out = io.TextIOWrapper(raw, encoding="ascii", errors="strict")
    f2 = LogFollower(logs, ascii_out, ascii_out)
    append(logs / "rank-0.out", "é\n")
    assert f2.poll() == 2
    ascii_out.flush()
    assert raw.getvalue() == b"[? 0] ok ?? bytes ?\n[? 0] ?\n"


def test_very_long_line_is_split_without_breaking_utf8(logs: Path) -> None:
    text = "é" * 100_000  # 200 kB, no newline yet
    append(logs / "rank-0.out", text)
    f, out, _ = follower(logs, tag=False)
    printed = f.poll()
    assert printed >= 3  # pieces of at most 64 KiB come out before the newline
    append(logs / "rank-0.out", "\n")
    printed += f.poll()
    pieces = out.getvalue().split("\n")[:-1]
    assert len(pieces) == printed
    assert "".join(pieces) == text  # no replacement character: cuts at UTF-8 boundaries
    assert all(len(p.encode()) <= 64 * 1024 for p in pieces)


def test_streams_batch_filter_and_raw(logs: Path) -> None:
    register(logs, 0, "a")
    register(logs, 1, "b")
    append(logs / "rank-0.out", "r0\n")
    append(logs / "rank-1.out", "r1\n")
    append(logs / "rank-1.err", "e1\n")
    append(logs / "batch.out", "srun: error: x\n")
    f, out, err = follower(logs)
    assert f.poll() == 4
    assert out.getvalue() == "[a 0] r0\n[b 1] r1\n"
    assert err.getvalue() == "[batch] srun: error: x\n[b 1] e1\n"

    f, out, err = follower(logs, rank=1, include_batch=False, tag=False)
    assert f.poll() == 2
    assert (out.getvalue(), err.getvalue()) == ("r1\n", "e1\n")


def test_progress_bars_and_truncation(logs: Path) -> None:
    f, out, _ = follower(logs)
    append(logs / "rank-0.out", " 10%\r 50%\r100%\r\n")
    assert f.poll() == 1
    assert out.getvalue() == "[? 0] 100%\n"  # what a terminal would show
    (logs / "rank-0.out").write_text("new\n")  # shorter: truncated, read from the start
    assert f.poll() == 1
    assert out.getvalue().endswith("[? 0] new\n")


def test_thousands_of_rank_files_are_cheap(logs: Path) -> None:
    for r in range(2000):
        append(logs / f"rank-{r}.out", f"start {r}\n")
        (logs / f"rank-{r}.err").touch()
    f, out, _ = follower(logs)
    assert f.poll() == 2000
    t0 = time.perf_counter()
    for _ in range(5):
        assert f.poll() == 0
    # One listing + one stat per file: milliseconds; the bound only catches reading every
    # file again (seconds for 4,000), with room for a loaded CI machine.
    assert (time.perf_counter() - t0) / 5 < 1
    append(logs / "rank-1234.out", "more\n")
    assert f.poll() == 1
    assert out.getvalue().endswith("[? 1234] more\n")


# --- exit codes --------------------------------------------------------------------------


def test_first_failure_ordering_and_signals(logs: Path) -> None:
    assert first_failure(logs) is None
    exit_file(logs, 0, 0, 1.0)
    assert first_failure(logs) is None  # success is no failure
    exit_file(logs, 3, -15, 50.0)  # killed later, by the teardown
    exit_file(logs, 5, 7, 20.0)
    assert first_failure(logs) == 7
    exit_file(logs, 9, -9, 10.0)
    assert first_failure(logs) == 128 + 9
    exit_file(logs, 2, 4, 10.0)  # same time: the lower rank wins
    assert first_failure(logs) == 4
    (logs / "rank-1.exit").write_text("{not json")
    (logs / "rank-4.exit.tmp.123").write_text('{"returncode": 1, "time": 0}')
    assert first_failure(logs) == 4
    assert first_failure(logs / "missing") is None


@pytest.mark.parametrize(
    ("state", "slurm_code", "ranks", "expected"),
    [
        ("COMPLETED", "0:0", [], 0),
        ("COMPLETED", "0:0", [(1, 3)], 3),
        ("FAILED", "1:0", [(0, 0), (1, 3)], 3),
        ("FAILED", "3:0", [], 3),
        ("FAILED", "0:9", [], 137),
        ("FAILED", None, [], 120),
        ("FAILED", "0:0", [], 120),
        ("FAILED", "1:0", [(0, -11)], 139),
        ("CANCELLED by 1000", "0:15", [(0, -15)], 143),
        ("CANCELLED+", None, [], 143),
        ("NODE_FAIL", None, [], 122),
        ("OUT_OF_MEMORY", "0:125", [(0, -9)], 123),
        ("TIMEOUT", "0:0", [(0, -15)], 124),
        ("BOOT_FAIL", None, [], 125),
        ("DEADLINE", None, [], 125),
        ("PREEMPTED", None, [], 125),
        ("TO", None, [], 124),
        ("", None, [], 120),
        ("SOMETHING_NEW", None, [], 120),
        ("SOMETHING_NEW", None, [(2, 200)], 200),  # >= 120, not a signal: unchanged
    ],
)
def test_job_exit_code(
    logs: Path, state: str, slurm_code: str | None, ranks: list[tuple[int, int]], expected: int
) -> None:
    for i, (rank, rc) in enumerate(ranks):
        exit_file(logs, rank, rc, 100.0 + i)
    assert job_exit_code(state, logs, slurm_code) == expected


def normalize_state(state: str) -> str:
    """Slurm's state as one word, as jobend reads it (jobend.normalize_state, which only
    this test called, was this line)."""
    return states.parse(state).value


def test_normalize_state() -> None:
    # The table itself (states.py) is checked against Slurm's man pages in test_states.py.
    assert (EXIT_UNKNOWN, EXIT_OTHER_FAILURE) == (120, 125)
    assert normalize_state("CANCELLED by 1000") == "CANCELLED"
    assert normalize_state(" running ") == "RUNNING"
    assert normalize_state("PD") == "PENDING"
    assert normalize_state("") == "UNKNOWN"
    assert normalize_state("SOMETHING_NEW") == "UNKNOWN"
    assert type(normalize_state("CA")) is str  # the value, not the enum member


# --- wait_and_stream ---------------------------------------------------------------------


class Script:
    """A fake clock and a status source that follows a timeline of states and file writes."""

    def __init__(
        self,
        states: list[tuple[float, JobStatus]],
        actions: list[tuple[float, Callable[[], None]]] | None = None,
    ) -> None:
        self.now = 1000.0
        self.start = self.now
        self.states = states
        self.actions = sorted(actions or [], key=lambda a: a[0])
        self.calls: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds
        while self.actions and self.actions[0][0] <= self.t:
            self.actions.pop(0)[1]()

    @property
    def t(self) -> float:
        return self.now - self.start

    def status(self, job_id: str) -> JobStatus:
        assert job_id == "42"
        self.calls.append(self.t)
        current = self.states[0][1]
        for since, st in self.states:
            if self.t >= since:
                current = st
        return current

    def run(self, logs: Path, is_tty: bool) -> tuple[int, str, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code, state = wait_and_stream(
            self, "42", logs, out, err, is_tty=is_tty, clock=self.clock, sleep=self.sleep
        )
        return code, state, out.getvalue(), err.getvalue()


PENDING = JobStatus("PENDING", "Priority", None)
RUNNING = JobStatus("RUNNING", "None", None)


def job_writes(logs: Path, rank: int, text: str) -> Callable[[], None]:
    return lambda: append(logs / f"rank-{rank}.out", text)


def test_pending_then_running_on_a_terminal(logs: Path) -> None:
    script = Script(
        [(0, PENDING), (3, JobStatus("PENDING", "Resources", None)), (12, RUNNING),
         (25.5, JobStatus("COMPLETED", "None", "0:0"))],
        [(12.5, lambda: register(logs, 0, "n0")), (13, job_writes(logs, 0, "step 1\nste")),
         (20, job_writes(logs, 0, "p 2\n")), (25, lambda: exit_file(logs, 0, 0, 1.0))],
    )  # fmt: skip
    code, state, out, err = script.run(logs, is_tty=True)
    assert (code, state) == (0, "COMPLETED")
    assert out == "[n0 0] step 1\n[n0 0] step 2\n"
    assert "\rpending (Priority) ... 0s\x1b[K" in err
    assert "\rpending (Priority) ... 2s\x1b[K" in err  # redrawn in place while waiting
    assert "\rpending (Resources) ... " in err
    assert err.endswith("\r\x1b[K")  # the status line is cleared before the logs
    assert "\n" not in err
    # Back-off while pending, ~1 s and slower while running, sooner once a rank exits.
    assert script.calls[:4] == [0, 0.25, 0.75, 1.75]
    assert len(script.calls) < 20
    assert 25.5 <= script.calls[-1] < 27.5, script.calls


def test_pending_status_on_a_pipe_prints_changes_only(logs: Path) -> None:
    script = Script(
        [(0, PENDING), (40, JobStatus("PENDING", "Resources", None)),
         (60, JobStatus("CONFIGURING", "None", None)), (70, RUNNING),
         (80, JobStatus("COMPLETED", "", "0:0"))],
    )  # fmt: skip
    code, state, _, err = script.run(logs, is_tty=False)
    assert (code, state) == (0, "COMPLETED")
    lines = err.splitlines()
    assert [line.split(" ...")[0] for line in lines] == [
        "pending (Priority)",
        "pending (Resources)",
        "configuring",
    ]
    assert "\r" not in err and "\x1b" not in err
    assert 40 <= int(lines[1].rsplit(" ", 1)[1].rstrip("s")) <= 45  # seen within one 5 s step


def test_failed_job_returns_first_failing_rank(logs: Path) -> None:
    def crash() -> None:
        register(logs, 0, "n0")
        register(logs, 1, "n1")
        append(logs / "rank-1.err", "Traceback\nValueError: boom")  # no final newline
        exit_file(logs, 1, 3, 10.0)
        exit_file(logs, 0, -15, 11.0)

    script = Script(
        [(0, RUNNING), (6, JobStatus("FAILED", "NonZeroExitCode", "3:0"))], [(5, crash)]
    )
    code, state, _, _ = script.run(logs, is_tty=False)
    assert (code, state) == (3, "FAILED")


def test_final_writes_arrive_after_the_end(logs: Path) -> None:
    # The shared file system shows the last lines and the exit file after sacct's end.
    script = Script(
        [(0, RUNNING), (2, JobStatus("COMPLETED", "", "0:0"))],
        [(1, lambda: register(logs, 0, "n0")), (2.5, job_writes(logs, 0, "bye\n")),
         (2.7, lambda: exit_file(logs, 0, 0, 1.0)), (2.9, job_writes(logs, 0, "too late"))],
    )  # fmt: skip
    code, _, out, _ = script.run(logs, is_tty=False)
    assert code == 0
    assert out == "[n0 0] bye\n"  # waited for the exit file, then stopped waiting
    assert script.t < 3.5


def test_cancelled_while_pending_waits_at_most_two_seconds(logs: Path) -> None:
    script = Script([(0, PENDING), (5, JobStatus("CANCELLED by 1000", "None", "0:0"))])
    code, state, out, err = script.run(logs, is_tty=False)
    assert (code, state, out) == (143, "CANCELLED", "")
    assert err.startswith("pending (Priority) ... 0s\n")
    assert script.t - script.calls[-1] <= 2.5


def test_status_calls_stay_few_over_hours(logs: Path) -> None:
    script = Script(
        [(0, PENDING), (3600, RUNNING), (3 * 3600, JobStatus("TIMEOUT", "TimeLimit", "0:0"))]
    )
    code, state, _, _ = script.run(logs, is_tty=True)
    assert (code, state) == (124, "TIMEOUT")
    pending_calls = [t for t in script.calls if t < 3600]
    running_calls = [t for t in script.calls if t >= 3600]
    assert len(pending_calls) <= 3600 / 5 + 10
    assert len(running_calls) <= 2 * 3600 / 10 + 10


def test_keyboard_interrupt_propagates_unchanged(logs: Path) -> None:
    interrupt = KeyboardInterrupt()

    class Interrupted(Script):
        def status(self, job_id: str) -> JobStatus:
            if self.t > 3:
                raise interrupt
            return super().status(job_id)

    script = Interrupted([(0, PENDING)])
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(KeyboardInterrupt) as info:
        wait_and_stream(
            script, "42", logs, out, err, is_tty=True, clock=script.clock, sleep=script.sleep
        )
    assert info.value is interrupt
    assert err.getvalue().endswith("\n")  # the status line is kept, the next text starts fresh


def test_real_clock_smoke(logs: Path) -> None:
    """The defaults (time.monotonic / time.sleep) work and finish promptly."""
    register(logs, 0, os.uname().nodename)
    exit_file(logs, 0, 0, 1.0)

    class Done:
        def status(self, job_id: str) -> JobStatus:
            return JobStatus("COMPLETED", "", "0:0")

    t0 = time.monotonic()
    assert wait_and_stream(Done(), "1", logs, io.StringIO(), io.StringIO(), is_tty=False) == (
        0,
        "COMPLETED",
    )
    assert time.monotonic() - t0 < 1
