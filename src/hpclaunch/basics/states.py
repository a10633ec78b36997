"""The one vocabulary of job states: Slurm's, plus hpclaunch's own CREATED and UNKNOWN.

Every state Slurm documents in squeue(1) and sacct(1) (JOB STATE CODES) has one row in
`SLURM_STATES`: its squeue short code, whether the job may still change, whether its
tasks may be writing logs, and the exit code of `hpclaunch run --wait` when it ends
there and no rank reported a failure (docs/internals.md). The local backend uses the
same names (RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT). tests/test_states.py
checks the table against the installed man pages.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Final, NamedTuple, Optional

# Exit codes of `hpclaunch run --wait` that no rank chose (docs/internals.md).
EXIT_UNKNOWN: Final = 120  # the job ended but hpclaunch cannot tell how
EXIT_OTHER_FAILURE: Final = 125  # a Slurm failure without a code of its own
# Ended by a signal: 128+N, as a shell reports a command a signal ended. A cancel
# (hpclaunch cancel, scancel, sweep cancel) ends the ranks with SIGTERM: 143 on every
# backend; Ctrl-C (SIGINT) 130; SIGTERM or SIGHUP to hpclaunch 143 or 129.
EXIT_CANCELLED: Final = 128 + 15
EXIT_INTERRUPTED: Final = 128 + 2


class State(str, Enum):
    """A job's state as users see it (`squeue -o %T`, `sacct -o State`, `hpclaunch runs`)."""

    # hpclaunch's own: the run directory is written, nothing submitted yet.
    CREATED = "CREATED"
    # Slurm's (squeue(1) and sacct(1), JOB STATE CODES; two flags only libslurm prints).
    BOOT_FAIL = "BOOT_FAIL"
    CANCELLED = "CANCELLED"
    COMPLETED = "COMPLETED"
    COMPLETING = "COMPLETING"
    CONFIGURING = "CONFIGURING"
    DEADLINE = "DEADLINE"
    FAILED = "FAILED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PENDING = "PENDING"
    POWER_UP_NODE = "POWER_UP_NODE"
    PREEMPTED = "PREEMPTED"
    REQUEUED = "REQUEUED"
    REQUEUE_FED = "REQUEUE_FED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    RESIZING = "RESIZING"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    REVOKED = "REVOKED"
    RUNNING = "RUNNING"
    SIGNALING = "SIGNALING"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    SUSPENDED = "SUSPENDED"
    TIMEOUT = "TIMEOUT"
    UPDATE_DB = "UPDATE_DB"
    # Anything hpclaunch cannot place: an empty answer, a state newer than this table.
    UNKNOWN = "UNKNOWN"

    def __str__(self) -> str:  # f"{state}" is "RUNNING" on every Python version
        return self.value


class SlurmState(NamedTuple):
    state: State
    short: Optional[str]  # squeue's compact code (`%t`); None where Slurm has none
    active: bool  # the job may still change
    streaming: bool  # the tasks may be writing logs
    exit_code: Optional[int]  # `run --wait` exit code when no rank reported a failure


_S = SlurmState
# fmt: off
SLURM_STATES: Final[tuple[SlurmState, ...]] = (
    #  state                  short  active streaming exit code
    _S(State.PENDING,         "PD",  True,  False, None),
    _S(State.CONFIGURING,     "CF",  True,  False, None),
    _S(State.POWER_UP_NODE,   None,  True,  False, None),  # libslurm flag; no man page
    _S(State.RUNNING,         "R",   True,  True,  None),
    _S(State.COMPLETING,      "CG",  True,  True,  None),
    _S(State.SIGNALING,       "SI",  True,  True,  None),
    _S(State.STAGE_OUT,       "SO",  True,  True,  None),
    _S(State.SUSPENDED,       "S",   True,  False, None),
    _S(State.STOPPED,         "ST",  True,  False, None),
    _S(State.RESIZING,        "RS",  True,  False, None),
    _S(State.REQUEUED,        "RQ",  True,  False, None),
    _S(State.REQUEUE_FED,     "RF",  True,  False, None),
    _S(State.REQUEUE_HOLD,    "RH",  True,  False, None),
    _S(State.RESV_DEL_HOLD,   "RD",  True,  False, None),
    _S(State.UPDATE_DB,       None,  True,  False, None),  # libslurm flag; no man page
    _S(State.COMPLETED,       "CD",  False, False, None),  # 0, or the failing rank's
    _S(State.FAILED,          "F",   False, False, None),  # the ranks', then Slurm's
    _S(State.CANCELLED,       "CA",  False, False, EXIT_CANCELLED),
    _S(State.NODE_FAIL,       "NF",  False, False, 122),
    _S(State.OUT_OF_MEMORY,   "OOM", False, False, 123),
    _S(State.TIMEOUT,         "TO",  False, False, 124),
    _S(State.BOOT_FAIL,       "BF",  False, False, EXIT_OTHER_FAILURE),
    _S(State.DEADLINE,        "DL",  False, False, EXIT_OTHER_FAILURE),
    _S(State.PREEMPTED,       "PR",  False, False, EXIT_OTHER_FAILURE),
    _S(State.REVOKED,         "RV",  False, False, EXIT_OTHER_FAILURE),
    _S(State.SPECIAL_EXIT,    "SE",  False, False, EXIT_OTHER_FAILURE),
)
# fmt: on

_BY_STATE: Final[Mapping[State, SlurmState]] = MappingProxyType(
    {row.state: row for row in SLURM_STATES}
)
# Every word `parse` understands: the states' names and squeue's short codes.
_WORDS: Final[Mapping[str, State]] = MappingProxyType(
    {
        **{s.value: s for s in State},
        **{row.short: row.state for row in SLURM_STATES if row.short is not None},
    }
)

# CREATED and UNKNOWN are in neither set: no Slurm job (yet), or none hpclaunch can place.
ACTIVE: Final = frozenset(row.state for row in SLURM_STATES if row.active)
TERMINAL: Final = frozenset(row.state for row in SLURM_STATES if not row.active)
STREAMING: Final = frozenset(row.state for row in SLURM_STATES if row.streaming)


def _word(text: str) -> State:
    return _WORDS.get(text.strip().rstrip("+").upper(), State.UNKNOWN)


def parse(text: str) -> State:
    """A state from what squeue, sacct, scontrol or a run record says.

    `CANCELLED by 1000`, `CANCELLED+`, `ca` and `CA` are CANCELLED; anything this table
    does not know is UNKNOWN. A comma list (`CANCELLED,COMPLETING`, as libslurm writes a
    state with its flags) is its first state, unless that one is final and a later one
    says the job is still changing.
    """
    if isinstance(text, State):
        return text
    words = text.split(None, 1)
    if not words:
        return State.UNKNOWN
    base, *flags = (_word(part) for part in words[0].split(","))
    if base not in ACTIVE:
        for flag in flags:
            if flag in ACTIVE:
                return flag
    return base


def _row(state: str) -> Optional[SlurmState]:
    return _BY_STATE.get(parse(state))


def is_active(state: str) -> bool:
    """Whether a job in this state may still change (CREATED and UNKNOWN: False)."""
    row = _row(state)
    return row is not None and row.active


def is_open(state: str) -> bool:
    """Whether a run or sweep point recorded in this state may still change: an active
    state, or CREATED (the folder is written, the backend has not answered yet: ask it).
    UNKNOWN is not: hpclaunch cannot place it (Slurm no longer knows the job).
    The one test of "not ended yet" for a record; `is_active` is for Slurm's answers."""
    return parse(state) is State.CREATED or is_active(state)


def is_streaming(state: str) -> bool:
    """Whether a job in this state may have tasks writing logs."""
    row = _row(state)
    return row is not None and row.streaming


def exit_code_for(state: str) -> Optional[int]:
    """`hpclaunch run --wait`'s exit code for a job that ended in `state` with no rank
    reporting a failure; None where the ranks decide (COMPLETED, FAILED), for active
    states, CREATED and UNKNOWN."""
    row = _row(state)
    return None if row is None else row.exit_code
