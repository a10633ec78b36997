"""The end of a batch script: the ranks' step and what goes around it (the GPU watch,
the staging guards' end, --requeue's trap and decision, a --chain member's end)."""

from __future__ import annotations

from hpclaunch.config.jobspec import JobSpec
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import gpu_watch_lines, requeue, venvmount


def launch_lines(
    spec: JobSpec, watch_argv: list[str], paths: RunPaths, srun_line: str
) -> list[str]:
    """The ranks' step; with the GPU watch, the step in the background and the watch
    beside it; with staging, the guards' end after it; with --requeue, the trap and the
    decision about the next attempt; with --chain, the end of this member (a done
    program cancels the rest)."""
    staging = bool(spec.stage or spec.stage_out)
    mounting = venvmount.mounts_on_nodes(spec)
    chain = spec.chain > 1
    watch = gpu_watch_lines.start_lines(spec, watch_argv, paths) if watch_argv else []
    body: list[str] = [""]
    if spec.requeue:
        body += requeue.launch_lines(srun_line, watch)
    elif watch:
        body += [srun_line + " &", "HPCLAUNCH_STEP_PID=$!", *watch]
        body += ['wait "$HPCLAUNCH_STEP_PID"', "HPCLAUNCH_RC=$?"]
    else:
        ended = staging or chain or mounting
        body += [srun_line, "HPCLAUNCH_RC=$?"] if ended else [srun_line]
    if watch:
        body += gpu_watch_lines.stop_lines()
    if staging:
        body += [
            "# The ranks are done: the guards copy --stage-out results back and clean up",
            "# (srun forwards SIGUSR1 to them; SIGTERM would make srun kill the step).",
            'kill -USR1 "$HPCLAUNCH_STAGE_PID" 2>/dev/null',
            'wait "$HPCLAUNCH_STAGE_PID"',
        ]
    if mounting:
        body += venvmount.end_lines()
    if spec.requeue:
        body += requeue.end_lines(spec.requeue, paths.run_dir, spec.time_s)
    elif chain:
        body += requeue.chain_end_lines(paths.run_dir)
    elif staging or watch or mounting:
        body.append('exit "$HPCLAUNCH_RC"')
    return body
