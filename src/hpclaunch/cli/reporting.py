"""What `hpclaunch run` and `rerun` say while a run starts and goes: warnings, the
dry-run preview, the announcement, the streamed output, the detach hint, the end.

The library side (launching.py, handle.py) prints nothing; this is the one place that
turns a run's life into lines for a person (or one JSON object with --json).
"""

from __future__ import annotations

import json
import signal
from dataclasses import replace
from typing import Optional, TextIO

from hpclaunch import launching
from hpclaunch.basics import states
from hpclaunch.cli.common import painted
from hpclaunch.config import layering
from hpclaunch.records import runrecord
from hpclaunch.records.runrecord import RunRecord


def run_and_report(
    req: launching.LaunchRequest,
    *,
    dry_run: bool,
    wait: bool,
    as_json: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    planned = launching.plan_run(req)
    for line in planned.notes:
        err.write(line if line.startswith("hpclaunch:") else f"hpclaunch: warning: {line}")
        err.write("\n")
    if dry_run:
        for line in launching.dry_run_notes(planned):
            err.write(line + "\n")
        out.write(launching.preview(planned, req.environ, as_json))
        return 0
    # Attached: a local run notes a Ctrl-C from its start on for the wait below.
    started = launching.start(replace(req, attached=True), planned)
    foreground = started.backend.foreground
    attached = wait or foreground
    # The announcement goes to stderr while the job's output follows on stdout.
    stream = err if attached and not as_json else out
    extra = {"step": True} if started.backend.step_of_allocation else {}
    launching.announce(stream, started, as_json, **extra)
    for note in started.notes:
        err.write(f"hpclaunch: warning: {note}\n")
    if not attached:
        return 0
    return _attached(started, out, err, foreground, as_json)


def _attached(
    started: launching.Started, out: TextIO, err: TextIO, foreground: bool, as_json: bool
) -> int:
    # With --json, stdout carries JSON only: the ranks' output goes to stderr.
    ranks_out = err if as_json else out
    try:
        code, state = launching.finish(started, ranks_out, err, is_tty=err.isatty())
    except KeyboardInterrupt as exc:
        if foreground:
            raise  # the backend already ended the tasks; nothing keeps running
        job = started.job_id
        err.write(
            f"\nhpclaunch: detached; job {job} keeps running.\n"
            f"  follow:  hpclaunch logs {job} --follow\n"
            f"  status:  hpclaunch status {job}\n"
            f"  cancel:  hpclaunch cancel {job}\n"
        )
        return 128 + getattr(exc, "signum", signal.SIGINT)  # Ctrl-C 130, SIGTERM 143
    record = runrecord.load(started.paths.run_dir)
    if record.state != state:  # the final write failed (a full disk): say what happened
        err.write(
            f"hpclaunch: warning: {record.path / 'run.json'} still reads {record.state}: "
            "it could not be updated; hpclaunch status brings it up to date later\n"
        )
        record = replace(record, state=state, exit_code=code)
    err.write(f"hpclaunch: {painted(summary(record), err)}\n")  # its state in colour
    if as_json:
        end = {"run_id": record.run_id, "job_id": record.job_id, "state": state, "exit_code": code}
        out.write(json.dumps(end) + "\n")
        out.flush()
    return code


def summary(record: RunRecord) -> str:
    """One line for a finished run: state, exit code, wall time, and which rank failed
    first with which exit code or signal (`status` prints the same)."""
    text = f"run {record.run_id} {record.state}, exit code {record.exit_code}"
    wall = _wall(record)
    if wall is not None:
        text += f", {_duration(wall)}"
    failure = record.events.first_failure
    # A state with its own exit code (CANCELLED, NODE_FAIL, TIMEOUT, ...) ended the ranks:
    # the first rank to die then died of it and is no cause (as in job_exit_code).
    by_state = states.exit_code_for(record.state) is not None
    if failure is not None and record.state != states.State.COMPLETED and not by_state:
        rank, rc = failure
        node = record.events.started.get(rank, "?")
        how = f"killed by {_signal_name(-rc)}" if rc < 0 else f"exit code {rc}"
        text += f"; rank {rank} on {node} failed first ({how})"
    elif record.state == states.State.NODE_FAIL.value:
        text += f"; {_lost_nodes(record)}"
    elif record.reason:
        text += f" ({record.reason})"
    return text + _attempts_note(record)


def _lost_nodes(record: RunRecord) -> str:
    """The node(s) that failed, as the ranks tell it: ranks started there, none ended."""
    events = record.events
    ended = {events.started.get(rank) for rank in events.returncodes}
    lost = sorted(set(events.started.values()) - ended)
    if not lost:
        return "a node failed"
    return f"{', '.join(lost)} failed (no rank there reported an end)"


def _attempts_note(record: RunRecord) -> str:
    """A requeued run: how many attempts, and why the last one was the last."""
    tried = record.events.attempts
    if not tried or (len(tried) == 1 and not tried[-1].reason):
        return ""
    text = f"; {len(tried)} attempt{'s' if len(tried) > 1 else ''}"
    given = layering.recorded_options(record.options).max_requeues  # as the user gave it
    budget = 3 if given is None or given < 0 else given
    # The budget is named whether the batch shell recorded its end before Slurm ended the
    # job (the attempt's reason) or Slurm's time limit came first (no reason recorded).
    ended = tried[-1].describe(last=True, budget=budget)
    if not ended and record.state == states.State.TIMEOUT and len(tried) > budget:
        ended = f"stopped at the time limit: the requeue budget (--max-requeues {budget}) is spent"
    return text + (f", the last {ended}" if ended else "")


def _wall(record: RunRecord) -> Optional[float]:
    """Seconds the ranks ran (first start to last end), else submission to end; of a
    requeued run, every attempt's batch shell from its start to its end, added up."""
    events = record.events
    spans = [a.ended_at - a.started_at for a in events.attempts if a.ended_at and a.started_at]
    if len(events.attempts) > 1 and spans:
        return max(0.0, sum(spans))
    if events.first_start is not None and events.last_end is not None:
        return max(0.0, events.last_end - events.first_start)
    if record.submitted_at is not None and record.ended_at is not None:
        return max(0.0, record.ended_at - record.submitted_at)
    return None


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
