"""The text of a sweep: the array's batch script (one per sweep), each point's job.sh
(the run's own script, rendered once with a token where the point number goes) and each
point's parameters (exported in a grid point's job.sh). Pure: --dry-run prints exactly
this. Shell text comes from shell.py.

The array script maps an array task to its point (offset + SLURM_ARRAY_TASK_ID: a sweep
split at MaxArraySize keeps continuous point numbers), sends its own output to the
point's folder (making its logs/ and checkpoints/), notes the point's start and end in
the point's events.jsonl (bash builtins only), sources an Optuna or W&B point's
params.env and runs the point's job.sh, which is a complete run script (staging,
containers, srun or torchrun). An Optuna point asks its
trial before and tells the result after, with the hpclaunch that submitted.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

from hpclaunch import node
from hpclaunch.basics import filemodes, shell
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.records.sweeprecord import (
    PARAMS_ENV,
    PARAMS_SH,
    POINT_END,
    POINT_SH,
    POINT_START,
    POINTS,
)
from hpclaunch.script import requeue
from hpclaunch.script.launchers import encode_argv
from hpclaunch.script.render import directives
from hpclaunch.sweeps.points import Point, format_value, params_json

HPCLAUNCH_SWEEP_ID = "HPCLAUNCH_SWEEP_ID"
HPCLAUNCH_POINT = "HPCLAUNCH_POINT"  # 0-based
HPCLAUNCH_POINTS = "HPCLAUNCH_POINTS"
HPCLAUNCH_PARAMS = "HPCLAUNCH_PARAMS"  # every parameter as one JSON object
POINT_DIR = "HPCLAUNCH_POINT_DIR"  # the array script's own variable
WANDB_POINT = node.HPCLAUNCH_WANDB_POINT  # the point's folder, for the agent's side
WANDB_EXIT = node.WANDB_EXIT  # the point's job.sh exit code, which the agent's run ends with


def new_token() -> str:
    """Stands for the point number in the rendered job.sh: letters and digits only, so
    that a number in its place is right in any quoting; random, so no user text holds it."""
    # os.urandom is what secrets.token_hex reads; secrets itself imports hashlib (OpenSSL).
    return "HPCLAUNCHPOINT" + os.urandom(8).hex().upper()


def point_paths(sweep: RunPaths, token: str) -> RunPaths:
    """A point's run paths, with the token where its number goes."""
    run_dir = sweep.run_dir / POINTS / token
    if sweep.run_dir in sweep.checkpoint_dir.parents:
        checkpoints = run_dir / "checkpoints"
    else:  # --checkpoint-root elsewhere: <root>/<exp>/<sweep-id>/points/<i>/checkpoints
        checkpoints = sweep.checkpoint_dir.parent / POINTS / token / "checkpoints"
    return RunPaths(f"{sweep.run_id}:{token}", run_dir, checkpoints, shipped_dir=sweep.run_dir)


def point_env(sweep_id: str, points: int, point: Point) -> list[tuple[str, str]]:
    """What a point's program sees of its sweep, in export order."""
    env = [(HPCLAUNCH_SWEEP_ID, sweep_id), (HPCLAUNCH_POINTS, str(points))]
    env.append((node.HPCLAUNCH_PARAM_NAMES, ",".join(point.params)))
    env += [(node.PARAM_PREFIX + k.upper(), format_value(v)) for k, v in point.params.items()]
    env.append((HPCLAUNCH_PARAMS, params_json(point)))
    if point.args:
        env.append((node.HPCLAUNCH_POINT_ARGS, encode_argv(point.args)))
    return env


def params_env(sweep_id: str, points: int, point: Point) -> str:
    """params.env: sourced by the array script (exports only, every value quoted)."""
    head = shell.comment(f"Point {point.index} of sweep {sweep_id} (written by hpclaunch)")
    return shell.lines([head, *(shell.export(k, v) for k, v in point_env(sweep_id, points, point))])


def split_head(point_script: str) -> tuple[str, str]:
    """A point's job.sh cut after its head (the shebang, #SBATCH lines and comments):
    a grid point's parameters are exported there, so no params.env is written per
    point (a 1,000-point sweep wrote 1,000 more files)."""
    start = 0
    while True:
        end = point_script.find("\n", start)
        if end < 0:
            return point_script, ""
        if not point_script.startswith("#", end + 1):
            return point_script[: end + 1], point_script[end + 1 :]
        start = end + 1


def with_params(point_script: str, sweep_id: str, points: int, point: Point) -> str:
    """A grid point's job.sh: its parameters exported after the head."""
    head, tail = split_head(point_script)
    return head + params_env(sweep_id, points, point) + tail


def array_script(
    spec: JobSpec,
    sweep: RunPaths,
    cwd: Path,
    points: int,
    trial_cmd: Optional[Sequence[str]] = None,
    agent: Sequence[str] = (),
    take_over: Sequence[str] = (),
    token: str = "",
) -> str:
    """The array's batch script; `trial_cmd` (Optuna) is run as `CMD ask|tell DIR POINT`;
    `agent` (W&B: the lines of a subshell that starts `wandb agent --count 1 ID` where the
    job runs) runs beside `take_over DIR PID`, which runs the point's job.sh when the
    agent hands it the sweep's command (sweeps/wandb.py). What the host writes once for
    every point is made the point's own here, when its task starts (a held 1,000-point
    sweep wrote 6,000 entries): its logs/ and checkpoints/, its job.sh (the sweep's
    point.sh, `token` -> its number) and its parameters (its line of the sweep's
    params.sh; Optuna's ask writes params.env)."""
    # Until the point's folder takes over: %A array job id, %a task id (%% a literal %).
    early = shell.sbatch_line("--output", str(sweep.logs).replace("%", "%%") + "/%A_%a.out")
    head = [
        early if line.startswith("#SBATCH --output=") else line
        for line in directives(spec, sweep, cwd)
    ]
    point_dir = shell.Join((str(sweep.run_dir / POINTS) + "/", shell.Var(HPCLAUNCH_POINT)))
    mode = filemodes.dir_mode(spec.share)
    # --checkpoint-root elsewhere: the host makes those (their parents too) per point.
    inside = sweep.run_dir in sweep.checkpoint_dir.parents
    checkpoints = f' "${POINT_DIR}/checkpoints"' if inside else ""
    check = f" && [ -d{checkpoints} ]" if inside else ""
    logs = f'"${POINT_DIR}/logs"'
    events = shell.Join((*point_dir.parts, "/" + node.EVENTS))
    body = [
        "#!/bin/bash",
        *head,
        shell.comment(
            f"Generated by hpclaunch for sweep {sweep.run_id}: {points} points, one array "
            "task each; edit the command, not this file."
        ),
        "# The point: the offset sbatch passes as $1 (a sweep split at MaxArraySize keeps",
        "# continuous point numbers) + this array task's id.",
        "unset HPCLAUNCH_RC",
        f"{HPCLAUNCH_POINT}=$(( ${{1:-0}} + SLURM_ARRAY_TASK_ID ))",
        f"export {HPCLAUNCH_POINT}",
        f"{POINT_DIR}={shell.word(point_dir)}",
        "# The point's own folders, private as the host makes them (the host makes none at",
        "# submission; a requeued point has them, a retried one that never started logs/).",
        f'[ -d {logs} ]{check} || mkdir -p -m {mode:o} "${POINT_DIR}" {logs}{checkpoints}',
        f'exec >>"${POINT_DIR}/logs/batch.out" 2>&1',
        *_job_sh_lines(sweep, token, filemodes.umask_of(spec.share)),
        'HPCLAUNCH_TASK="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        "# Start and end go to the point's events.jsonl (bash builtins, no process).",
        _event_line(POINT_START, events, with_rc=False),
    ]
    if trial_cmd:
        ask = shell.command([*trial_cmd, "ask", str(sweep.run_dir)])
        body += [
            "# Optuna: ask this point's trial (a requeued point gets its own again).",
            f'{ask} "${HPCLAUNCH_POINT}" "$HPCLAUNCH_TASK" || HPCLAUNCH_RC=$?',
        ]
    body.append('if [ -z "${HPCLAUNCH_RC-}" ]; then')
    if trial_cmd:  # the trial's parameters, written by its ask
        body.append(f'    . "${POINT_DIR}/{PARAMS_ENV}"')
    else:  # line POINT+1 of params.sh: bash builtins, no process
        table = shell.quote(str(sweep.run_dir / PARAMS_SH))
        body += [
            f'    mapfile -t -s "${HPCLAUNCH_POINT}" -n 1 HPCLAUNCH_PARAMS_LINE <{table}',
            '    . /dev/stdin <<<"${HPCLAUNCH_PARAMS_LINE[0]-}"',
        ]
    body += _run_lines(spec, agent, take_over)
    body.append("fi")
    if trial_cmd:
        # Told before the end event: once the point's record has ended, `sweep status`
        # fails its trial if still RUNNING (trials.fail_stale).
        tell = shell.command([*trial_cmd, "tell", str(sweep.run_dir)])
        body.append(f'{tell} "${HPCLAUNCH_POINT}" "$HPCLAUNCH_RC"')
    body += [_event_line(POINT_END, events, with_rc=True), 'exit "$HPCLAUNCH_RC"']
    return shell.lines(body)


def _run_lines(spec: JobSpec, agent: Sequence[str], take_over: Sequence[str]) -> list[str]:
    """How the task runs the point: W&B's agent, job.sh under --requeue, or job.sh."""
    if agent:
        return _wandb_lines(agent, take_over)
    if spec.requeue:
        sig = spec.requeue.signal
        return [
            "    # --requeue: Slurm signals this shell only (B:); the point's job.sh, whose trap",
            "    # saves and requeues this task alone (its own SLURM_JOB_ID), gets it from here.",
            f"    trap 'kill -{sig} \"$HPCLAUNCH_POINT_PID\" 2>/dev/null' {sig}",
            f'    bash "${POINT_DIR}/job.sh" &',
            "    HPCLAUNCH_POINT_PID=$!",
            *requeue.wait_lines("HPCLAUNCH_POINT_PID", "    "),
            "    # job.sh queued this task again: Slurm ends this attempt now. The point goes",
            "    # on, so no end is written and no result told (its trial is resumed).",
            f'    mark="${POINT_DIR}/{requeue.REQUEUED_MARK}${{SLURM_RESTART_COUNT:-0}}"',
            '    if [ -e "$mark" ]; then',
            "        while :; do sleep 60 & wait $!; done",
            "    fi",
        ]
    return [f'    bash "${POINT_DIR}/job.sh"', "    HPCLAUNCH_RC=$?"]


def _job_sh_lines(sweep: RunPaths, token: str, umask: int) -> list[str]:
    """The point's job.sh from the sweep's point.sh (once: a requeued or retried point
    has it), with the share's modes, written aside and renamed."""
    if not token:
        return []
    template = shell.quote(str(sweep.run_dir / POINT_SH))
    job, aside = f'"${POINT_DIR}/job.sh"', f'"${POINT_DIR}/.job.sh.$$"'
    return [
        f"if [ ! -f {job} ]; then",
        f"    HPCLAUNCH_JOB_SH=$(<{template})",
        f'    HPCLAUNCH_JOB_SH="${{HPCLAUNCH_JOB_SH//{token}/${HPCLAUNCH_POINT}}}"',
        f"    ( umask {umask:03o} && printf '%s\\n' \"$HPCLAUNCH_JOB_SH\" >{aside} ) &&",
        f"        mv -f {aside} {job}",
        "fi",
    ]


def params_line(sweep_id: str, points: int, point: Point) -> str:
    """A point's line of params.sh: one export of every variable, each value quoted
    (shell.quote never writes a newline)."""
    pairs = point_env(sweep_id, points, point)
    return "export " + " ".join(_assignment(k, v) for k, v in pairs)


@functools.lru_cache(maxsize=4096)
def _assignment(name: str, value: str) -> str:
    """NAME=quoted, once per pair: a grid's names and values repeat from point to point."""
    return f"{shell.check_name(name)}={shell.quote(value)}"


def _wandb_lines(agent: Sequence[str], take_over: Sequence[str]) -> list[str]:
    return [
        "    # W&B: the agent runs where the job runs (after the --setup lines, inside the",
        "    # container, with the run's --env values); its `hpclaunch run -- PROGRAM` hands",
        "    # the program line here, and this point's job.sh starts every rank with it.",
        f'    export {WANDB_POINT}="${POINT_DIR}"',
        "    (",
        *agent,
        "    ) &",
        "    HPCLAUNCH_AGENT_PID=$!",
        f'    {shell.command(list(take_over))} "${POINT_DIR}" "$HPCLAUNCH_AGENT_PID"',
        "    HPCLAUNCH_RC=$?",
        '    wait "$HPCLAUNCH_AGENT_PID"',
    ]


def _event_line(kind: str, events: shell.Join, with_rc: bool) -> str:
    fields = '{"event":"%s","job":"%s","job_id":"%s","node":"%s","time":%s'
    args = [
        kind,
        "$HPCLAUNCH_TASK",
        "${SLURM_JOB_ID-}",
        "${SLURMD_NODENAME-}",
        "${EPOCHREALTIME/,/.}",
    ]
    if with_rc:
        fields += ',"exit_code":%d'
        args.append("$HPCLAUNCH_RC")
    quoted = " ".join(f'"{a}"' if a.startswith("$") else shell.quote(a) for a in args)
    return f"printf {shell.quote(fields + '}' + chr(10))} {quoted} >>{shell.word(events)}"


def point_script(template: str, token: str, index: int) -> str:
    return template.replace(token, str(index))


def sbatch_argv(script: Path, array_spec: str, offset: int) -> list[str]:
    """What --dry-run shows: the backend's own line (backends/slurm.array_argv)."""
    from hpclaunch.backends.slurm import array_argv

    return array_argv(script, array_spec, offset)


def preview_table(points: Sequence[Point], limit: int = 10) -> list[str]:
    """The point table for --dry-run: all of it, or the first and last `limit`."""
    rows = [f"{p.index:>6}  {p.label()}" for p in points]
    if len(rows) > 2 * limit:
        rows = [*rows[:limit], f"{'...':>6}  ({len(rows) - 2 * limit} more)", *rows[-limit:]]
    return ["# points:", *(f"# {row}" for row in rows)]


def submit_lines(argvs: Sequence[Sequence[str]], secret: Mapping[str, str]) -> list[str]:
    out = ["# submit with:", *(shell.command(list(a)) for a in argvs)]
    if secret:
        out.append("# secret variables passed through the environment only: " + ", ".join(secret))
    return out
