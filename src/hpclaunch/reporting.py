"""What `hpclaunch run` and `rerun` say while a run starts and goes: warnings, the
dry-run preview, the announcement, the streamed output, the detach hint, the end.

The library side (launching.py, handle.py) prints nothing; this is the one place that
turns a run's life into lines for a person (or one JSON object with --json).
"""

from __future__ import annotations

from typing import TextIO

from . import launching


def run_and_report(
    req: launching.Request,
    *,
    dry_run: bool,
    wait: bool,
    as_json: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    planned = launching.plan(req)
    for line in planned.notes:
        err.write(line if line.startswith("hpclaunch:") else f"hpclaunch: warning: {line}")
        err.write("\n")
    if dry_run:
        for line in launching.dry_run_notes(planned):
            err.write(line + "\n")
        out.write(launching.preview(planned, req.environ, as_json))
        return 0
    started = launching.start(req, planned)
    foreground = started.backend.foreground
    attached = wait or foreground
    # The announcement goes to stderr while the job's output follows on stdout.
    stream = err if attached and not as_json else out
    extra = {"step": True} if started.backend.kind.startswith("step") else {}
    launching.announce(stream, started, as_json, **extra)
    if not attached:
        return 0
    return _attached(started, out, err, foreground)


def _attached(started: launching.Started, out: TextIO, err: TextIO, foreground: bool) -> int:
    try:
        code, state = launching.finish(started, out, err, is_tty=err.isatty())
    except KeyboardInterrupt:
        if foreground:
            raise  # the backend already ended the tasks; nothing keeps running
        job = started.job_id
        err.write(
            f"\nhpclaunch: detached; job {job} keeps running.\n"
            f"  follow:  hpclaunch logs {job} --follow\n"
            f"  status:  hpclaunch status {job}\n"
            f"  cancel:  hpclaunch cancel {job}\n"
        )
        return 130
    if code != 0 and not foreground:
        err.write(f"hpclaunch: job {started.job_id} ended {state}, exit code {code}\n")
    return code
