"""--requeue: the options checked, and the batch-shell text that does signal -> checkpoint
-> requeue -> resume. Pure: render.py puts these lines into job.sh.

What the batch shell does, and why each part is there (docs/resumable.md for users):

- `#SBATCH --signal=B:SIG@S` sends the signal to the batch shell only (never a step, so
  never the staging guard, whose own signals mean something else). A trap runs only
  between commands, so the ranks' srun runs in the background and the shell waits for
  it: `wait` returns at once when a trapped signal arrives.
- The trap passes the signal to the ranks' step with `kill -SIG <srun>`: srun forwards
  it to every process of the step's tasks, whatever runs inside (a container runtime,
  torchrun agents, which ignore it by the bootstrap's doing, and their workers).
- The ranks get S - margin seconds to save and exit; then the step is ended, so that
  stage-out and `scontrol requeue` happen before Slurm's own end at the time limit.
- `scontrol requeue` runs in the batch shell, outside any container (images lack
  scontrol), with the job's id, or an array task's `<array>_<task>` (a sweep point
  requeues only its own task; the last task of an array runs under the array's own job
  id, and requeueing that id would requeue every task). It is never run after a
  SIGTERM (scancel, preemption without a user signal, the time limit itself): bash's
  default for SIGTERM ends the shell, and requeue would revive a finished job.
- Nodes an earlier attempt lost (the run folder's `exclude` file, script/lostnodes.py):
  the job is requeued held, its ExcNodeList set, and released (excluding_lines).
- SLURM_RESTART_COUNT counts every requeue, Slurm's own (node failure, preemption)
  and hpclaunch's, so it is both the attempt number and the budget's count.
- The batch shell appends attempt_start / attempt_end events to events.jsonl (bash
  builtins only); records/runrecord.py folds them into the run's attempts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from hpclaunch.basics import shell
from hpclaunch.basics.units import format_time
from hpclaunch.config.jobspec import Requeue
from hpclaunch.config.options import RunOptions
from hpclaunch.errors import UserError
from hpclaunch.node import HPCLAUNCH_ATTEMPT, HPCLAUNCH_REQUEUE_SIGNAL
from hpclaunch.records.attempts import BUDGET, CANCELLED, DONE, ENDED, REQUEUE_FAILED, REQUEUED
from hpclaunch.records.runpaths import ATTEMPT_PREFIX, CANCELLED_FILE

PERIODIC_S = 30  # slurmctld's time-limit check interval (PERIODIC_TIMEOUT in its source)
MARGIN_S = 15  # kept back from --signal-before for stage-out and `scontrol requeue`
MAX_REQUEUES = 1000  # a typo guard, far above any real campaign
CHAIN_JOBS = "chain.jobs"  # in the run folder: a chain's job ids, one per line
EXCLUDE_FILE = "exclude"  # in the run folder: the nodes excluded from later attempts
DONE_FILE = "hpclaunch-done"  # in HPCLAUNCH_CHECKPOINT_DIR: the program says it is done
REQUEUED_MARK = "requeued-"  # + attempt, in the run folder: this attempt queued the next
HPCLAUNCH_RESUME = "HPCLAUNCH_RESUME"
HPCLAUNCH_DONE_FILE = "HPCLAUNCH_DONE_FILE"


def from_values(
    options: RunOptions, time_s: Optional[int], *, local: bool, in_allocation: bool
) -> Optional[Requeue]:
    """The --requeue settings, or None without --requeue; the others alone are refused."""
    extras = [
        name
        for name, given in (
            ("--max-requeues", options.max_requeues),
            ("--requeue-signal", options.requeue_signal),
            ("--signal-before", options.signal_before),
        )
        if given is not None
    ]
    if not options.requeue:
        if extras:
            name = extras[0]
            raise UserError(name, "given without --requeue", "", "Add --requeue, or drop it")
        return None
    if local or in_allocation:
        where = "a local run" if local else "a step of the current allocation"
        raise UserError(
            "--requeue",
            f"not for {where}",
            "only a batch job has a time limit to outlive",
            "Submit it to a Slurm cluster (--cluster slurm), or drop --requeue",
        )
    most = 3 if options.max_requeues is None else options.max_requeues
    if not 0 <= most <= MAX_REQUEUES:
        raise UserError(
            "--max-requeues", str(most), f"0 to {MAX_REQUEUES}", "Give e.g. --max-requeues 3"
        )
    before = 120 if options.signal_before is None else options.signal_before
    if before <= MARGIN_S:
        raise UserError(
            "--signal-before",
            f"{before} s",
            f"more than {MARGIN_S} s (kept back for stage-out and the requeue)",
            "Give e.g. --signal-before 120",
        )
    if time_s is not None and before >= time_s:
        raise UserError(
            "--signal-before",
            f"{before} s with a time limit of {format_time(time_s)}",
            "must be below the time limit",
            _at_most(time_s),
        )
    if time_s is not None and before + PERIODIC_S >= time_s:
        # slurmctld checks time limits every PERIODIC_S s and signals at the first check
        # where the time left is at most --signal-before + PERIODIC_S: so large a value
        # signals every attempt at its first check, maybe before its ranks have started.
        raise UserError(
            "--signal-before",
            f"{before} s with a time limit of {format_time(time_s)}",
            f"at most the time limit minus {PERIODIC_S + 1} s: Slurm would signal every "
            "attempt as soon as it starts",
            _at_most(time_s),
        )
    signal = options.requeue_signal or "USR2"
    return Requeue(max_requeues=most, signal=signal, before_s=before, margin_s=MARGIN_S)


def _at_most(time_s: int) -> str:
    """The fix for a --signal-before too large for the time limit: the largest value
    accepted (below the time limit less PERIODIC_S; -t is whole minutes, so above MARGIN_S)."""
    return f"Give at most {max(MARGIN_S + 1, time_s - PERIODIC_S - 1)} s, or a longer -t"


def directives(req: Requeue) -> list[str]:
    return [
        shell.sbatch_line("--requeue"),
        # B: the batch shell only; it passes the signal on to the ranks' step itself.
        shell.sbatch_line("--signal", f"B:{req.signal}@{req.before_s}"),
    ]


def log_dir(logs: Path) -> shell.Join:
    """HPCLAUNCH_LOG_DIR of a requeued run: logs/attempt-N for attempt N."""
    return shell.Join((str(logs / ATTEMPT_PREFIX), shell.Var(HPCLAUNCH_ATTEMPT)))


def env(req: Optional[Requeue], checkpoint_dir: Path) -> list[tuple[str, shell.Word]]:
    """What a program of a requeued run (or a chain: req None) sees besides the attempt."""
    signal = [(HPCLAUNCH_REQUEUE_SIGNAL, req.signal)] if req else []
    return [*signal, (HPCLAUNCH_DONE_FILE, str(checkpoint_dir / DONE_FILE))]


def attempt_lines(events: Path, chain: bool = False) -> list[str]:
    """Before the exports: the attempt number and the event writer."""
    fields = '{"event":"%s","attempt":%d,"job_id":"%s",%s"time":%s}\\n'
    if chain:
        number = [
            "",
            "# --chain: this job's place in the chain (0, 1, ...), which sbatch passes as $1.",
            f"{HPCLAUNCH_ATTEMPT}=${{1:-0}}",
        ]
    else:
        number = [
            "",
            "# --requeue: the attempt (0, 1, ...). Slurm counts every requeue in",
            "# SLURM_RESTART_COUNT, its own (node failure, preemption) and hpclaunch's.",
            f"{HPCLAUNCH_ATTEMPT}=${{SLURM_RESTART_COUNT:-0}}",
        ]
    return [
        *number,
        f"export {HPCLAUNCH_ATTEMPT}",
        "hpclaunch_event() {  # one line to events.jsonl; bash builtins only, no process",
        "    local now",
        "    printf -v now '%(%s)T' -1",
        "    now=${EPOCHREALTIME:-$now}",
        f'    printf \'{fields}\' "$1" "${HPCLAUNCH_ATTEMPT}" "${{SLURM_JOB_ID-}}" "$2" '
        f'"${{now/,/.}}" >>{shell.quote(str(events))}',
        "}",
    ]


def start_lines(req: Requeue) -> list[str]:
    """After the exports: resume or done, the trap, the event; before the launch."""
    return [*resume_lines(req.max_requeues + 1), *trap_lines(req)]


def resume_lines(most: int) -> list[str]:
    """The attempt's start: said, noted, skipped when the program is done, resumed when
    something was saved (by an earlier attempt of a requeue or member of a chain)."""
    return [
        'echo "hpclaunch: attempt ${HPCLAUNCH_ATTEMPT} (at most '
        f'{most}) of job ${{SLURM_JOB_ID-}} on ${{SLURM_JOB_NODELIST-}}"',
        'hpclaunch_event attempt_start "\\"nodes\\":\\"${SLURM_JOB_NODELIST-}\\","',
        f'if [ -e "${HPCLAUNCH_DONE_FILE}" ]; then',
        f'    echo "hpclaunch: ${HPCLAUNCH_DONE_FILE} exists: the program is done; nothing to run"',
        f'    hpclaunch_event attempt_end \'"reason":"{DONE}","exit_code":0,\'',
        "    exit 0",
        "fi",
        "# Something saved by an earlier attempt (or chain member): the program resumes.",
        "shopt -s nullglob dotglob",
        'HPCLAUNCH_SAVED=("$HPCLAUNCH_CHECKPOINT_DIR"/*)',
        "shopt -u nullglob dotglob",
        f"(( ${{#HPCLAUNCH_SAVED[@]}} )) && export {HPCLAUNCH_RESUME}=1",
        "unset HPCLAUNCH_SAVED",
    ]


def trap_lines(req: Requeue) -> list[str]:
    sig = req.signal
    return [
        "HPCLAUNCH_SIGNALLED=0 HPCLAUNCH_STEP_PID= HPCLAUNCH_TIMER_PID=",
        "hpclaunch_on_signal() {",
        "    (( HPCLAUNCH_SIGNALLED )) && return",
        "    HPCLAUNCH_SIGNALLED=1",
        "    printf -v HPCLAUNCH_SIGNALLED_AT '%(%s)T' -1",
        '    hpclaunch_event signal ""',
        '    [ -n "$HPCLAUNCH_STEP_PID" ] || return  # before the launch: it is skipped',
        f'    echo "hpclaunch: SIG{sig} from Slurm: passing it to the ranks; they have '
        f'{req.grace_s} s to save and exit"',
        f'    kill -{sig} "$HPCLAUNCH_STEP_PID" 2>/dev/null',
        f"    if (( {HPCLAUNCH_ATTEMPT} < {req.max_requeues} )); then",
        "        # Bounded: stage-out and the requeue must happen before the time limit.",
        f'        {{ sleep {req.grace_s}; echo "hpclaunch: the ranks did not exit within '
        f'{req.grace_s} s: ending them"; kill -TERM "$HPCLAUNCH_STEP_PID"; sleep 5; '
        'kill -KILL "$HPCLAUNCH_STEP_PID"; } 2>/dev/null &',
        "        HPCLAUNCH_TIMER_PID=$!",
        "    fi",
        "}",
        f"trap hpclaunch_on_signal {sig}",
        "printf -v HPCLAUNCH_STARTED_AT '%(%s)T' -1",
    ]


def launch_lines(srun_line: str, beside: Sequence[str] = ()) -> list[str]:
    """The ranks' step in the background, so that the trap runs while it goes on;
    `beside`: lines started once it runs (the GPU watch)."""
    return [
        "if (( ! HPCLAUNCH_SIGNALLED )); then",
        srun_line + " &",
        "HPCLAUNCH_STEP_PID=$!",
        *beside,
        *wait_lines("HPCLAUNCH_STEP_PID"),
        '[ -n "$HPCLAUNCH_TIMER_PID" ] && kill "$HPCLAUNCH_TIMER_PID" 2>/dev/null',
        "else",
        "HPCLAUNCH_RC=0",
        "fi",
    ]


def wait_lines(pid_var: str, indent: str = "") -> list[str]:
    """Wait for a background child into HPCLAUNCH_RC, through trapped signals."""
    return [
        indent + line
        for line in (
            "while :; do",
            f'    wait "${pid_var}"',
            "    HPCLAUNCH_RC=$?",
            "    # A trapped signal ends `wait` early (status > 128) while the child goes on.",
            f'    (( HPCLAUNCH_RC > 128 )) && kill -0 "${pid_var}" 2>/dev/null || break',
            "done",
        )
    ]


def end_lines(req: Requeue, run_dir: Path, time_s: Optional[int]) -> list[str]:
    """After the ranks (and stage-out): complete, done, or queue the next attempt."""
    cancelled = shell.quote(str(run_dir / CANCELLED_FILE))
    # Signalled well before the time limit's window: a preemption (Slurm may send the
    # time-limit signal up to a minute early).
    limit = f"{time_s - req.before_s - 90}" if time_s else ""
    why = (
        [
            "HPCLAUNCH_WHY=time-limit",
            f"(( HPCLAUNCH_SIGNALLED_AT - HPCLAUNCH_STARTED_AT < {limit} )) "
            "&& HPCLAUNCH_WHY=preempted",
        ]
        if limit
        else ["HPCLAUNCH_WHY=time-limit"]
    )
    end = (
        '"\\"reason\\":\\"%s\\",\\"why\\":\\"${HPCLAUNCH_WHY-}\\",\\"exit_code\\":${HPCLAUNCH_RC},"'
    )
    return [
        f'if [ -e "${HPCLAUNCH_DONE_FILE}" ]; then',
        f'    echo "hpclaunch: the program wrote ${HPCLAUNCH_DONE_FILE}: no further attempt"',
        f"    hpclaunch_event attempt_end {end % DONE}",
        "elif (( ! HPCLAUNCH_SIGNALLED )); then",
        f"    hpclaunch_event attempt_end {end % ENDED}",
        f"elif [ -e {cancelled} ]; then  # `hpclaunch cancel` came with the signal",
        f"    hpclaunch_event attempt_end {end % CANCELLED}",
        f"elif (( {HPCLAUNCH_ATTEMPT} >= {req.max_requeues} )); then",
        *("    " + line for line in why),
        f'    echo "hpclaunch: the requeue budget (--max-requeues {req.max_requeues}) is '
        'spent: no further attempt"',
        f"    hpclaunch_event attempt_end {end % BUDGET}",
        "    HPCLAUNCH_RC=124  # as Slurm's TIMEOUT: the work is not finished",
        "else",
        *("    " + line for line in why),
        f"    hpclaunch_event attempt_end {end % REQUEUED}",
        "    # An array task (a sweep point) by <array>_<task>: the task that runs under the",
        "    # array's own job id would requeue every task of the array by that id.",
        '    if [ -n "${SLURM_ARRAY_JOB_ID-}" ]; then',
        '        HPCLAUNCH_REQUEUE_ID="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        "    else",
        '        HPCLAUNCH_REQUEUE_ID="$SLURM_JOB_ID"',
        "    fi",
        '    echo "hpclaunch: requeueing job ${HPCLAUNCH_REQUEUE_ID} ($HPCLAUNCH_WHY)"',
        "    # Said before the requeue (Slurm may end this shell right after it): a sweep's",
        "    # array script sees it and writes no end for the point, which goes on.",
        f'    : >"$HPCLAUNCH_RUN_DIR/{REQUEUED_MARK}${HPCLAUNCH_ATTEMPT}"',
        *excluding_lines(run_dir),
        '    if scontrol requeue "$HPCLAUNCH_REQUEUE_ID"; then',
        "        # Slurm ends this attempt now (SIGTERM ends this shell); never exit first.",
        "        while :; do sleep 60 & wait $!; done",
        "    fi",
        f'    rm -f "$HPCLAUNCH_RUN_DIR/{REQUEUED_MARK}${HPCLAUNCH_ATTEMPT}"',
        "    HPCLAUNCH_RC=1",
        f"    hpclaunch_event attempt_end {end % REQUEUE_FAILED}",
        "fi",
        'exit "$HPCLAUNCH_RC"',
    ]


def excluding_lines(run_dir: Path) -> list[str]:
    """Nodes lost by an earlier attempt (the run folder's exclude file): the job is held
    as it is requeued, its ExcNodeList set, and released; ExcNodeList changes only while
    a job is pending (scontrol(1), https://slurm.schedmd.com/scontrol.html#OPT_ExcNodeList)."""
    excluded = shell.quote(str(run_dir / EXCLUDE_FILE))
    return [
        "    HPCLAUNCH_EXCLUDE=",
        f"    [ -r {excluded} ] && read -r HPCLAUNCH_EXCLUDE <{excluded}",
        '    if [ -n "$HPCLAUNCH_EXCLUDE" ]; then',
        "        trap '' TERM  # the requeue ends this job: finish the three calls first",
        '        if scontrol requeuehold "$HPCLAUNCH_REQUEUE_ID"; then',
        '            scontrol update JobId="$HPCLAUNCH_REQUEUE_ID" '
        'ExcNodeList="$HPCLAUNCH_EXCLUDE"',
        '            scontrol release "$HPCLAUNCH_REQUEUE_ID"',
        "            while :; do sleep 60 & wait $!; done",
        "        fi",
        "        trap - TERM",
        "    fi",
    ]


def chain_end_lines(run_dir: Path) -> list[str]:
    """After a chain member's ranks: done -> the later members are cancelled."""
    jobs = shell.quote(str(run_dir / CHAIN_JOBS))
    end = '"\\"reason\\":\\"%s\\",\\"exit_code\\":${HPCLAUNCH_RC},"'
    return [
        f'if [ -e "${HPCLAUNCH_DONE_FILE}" ]; then',
        f"    hpclaunch_event attempt_end {end % DONE}",
        "    # The later members would only start to find the work done: cancel them now.",
        f"    mapfile -t HPCLAUNCH_CHAIN <{jobs} 2>/dev/null",
        f'    HPCLAUNCH_LATER=("${{HPCLAUNCH_CHAIN[@]:$(( {HPCLAUNCH_ATTEMPT} + 1 ))}}")',
        "    if (( ${#HPCLAUNCH_LATER[@]} )); then",
        '        echo "hpclaunch: the program is done: cancelling the rest of the chain '
        '(${HPCLAUNCH_LATER[*]})"',
        '        scancel "${HPCLAUNCH_LATER[@]}"',
        "    fi",
        "else",
        f"    hpclaunch_event attempt_end {end % ENDED}",
        "fi",
        'exit "$HPCLAUNCH_RC"',
    ]
