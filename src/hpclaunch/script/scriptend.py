"""The end of a batch script: the ranks' step and what goes around it (the GPU watch,
the staging guards' end, --requeue's trap and decision, a --chain member's end)."""

from __future__ import annotations

from typing import Optional

from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profiles import Profile
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import badnodes, gpu_watch_lines, imagebcast, requeue, venvmount


def launch_lines(
    spec: JobSpec,
    watch_argv: list[str],
    paths: RunPaths,
    srun_line: str,
    profile: Optional[Profile] = None,
) -> list[str]:
    """The ranks' step; with the GPU watch, the step in the background and the watch
    beside it; with staging, the guards' end after it; with --requeue, the trap and the
    decision about the next attempt; with --chain, the end of this member (a done
    program cancels the rest); with --preflight/--spares, the checks first and the step
    in a loop that keeps it off bad nodes."""
    staging = bool(spec.stage or spec.stage_out)
    mounting = venvmount.mounts_on_nodes(spec)
    # Without stage guards, a step after the ranks removes the image's copies.
    dropping = bool(profile and imagebcast.end_lines(spec, profile, paths))
    chain = spec.chain > 1
    watch = gpu_watch_lines.start_lines(spec, watch_argv, paths) if watch_argv else []
    watch = badnodes.watch_lines(spec, watch)  # --preflight/--spares: off the same nodes
    placed = badnodes.placing(spec)  # --preflight/--spares: the step in a loop
    step: list[str] = []
    if spec.requeue:
        step += requeue.launch_lines(srun_line, watch)
    elif watch:
        step += [srun_line + " &", "HPCLAUNCH_STEP_PID=$!", *watch]
        step += ['wait "$HPCLAUNCH_STEP_PID"', "HPCLAUNCH_RC=$?"]
    else:
        ended = staging or chain or mounting or placed or dropping
        step += [srun_line, "HPCLAUNCH_RC=$?"] if ended else [srun_line]
    if watch:
        step += gpu_watch_lines.stop_lines()
    body: list[str] = [""]
    if placed and profile:  # the profile: the nodes' python3, the node-local folder
        body += badnodes.setup_lines(spec, paths, profile.local_dir, profile.python)
        body += badnodes.loop_lines(spec, paths, step)
    else:
        body += step
    if staging:
        body += [
            "# The ranks are done: the guards copy --stage-out results back and clean up",
            "# (srun forwards SIGUSR1 to them; SIGTERM would make srun kill the step).",
            'kill -USR1 "$HPCLAUNCH_STAGE_PID" 2>/dev/null',
            'wait "$HPCLAUNCH_STAGE_PID"',
        ]
    if mounting:
        body += venvmount.end_lines()
    if profile and dropping:
        body += imagebcast.end_lines(spec, profile, paths)
    if spec.requeue:
        body += requeue.end_lines(spec.requeue, paths.run_dir, spec.time_s)
    elif chain:
        body += requeue.chain_end_lines(paths.run_dir)
    elif staging or watch or mounting or placed or dropping:
        body.append('exit "$HPCLAUNCH_RC"')
    return body
