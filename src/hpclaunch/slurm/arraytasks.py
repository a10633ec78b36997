"""Slurm job arrays as Slurm tells of them: array range text, `squeue -r` and `sacct`
answers about array tasks. Pure: the Slurm backend runs the commands named by the
constants below (one squeue + at most one sacct per refresh, whatever the number of
arrays and plain jobs) and passes their text in, so tests feed recorded output.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Optional

from hpclaunch.basics import states


def expand(spec: str) -> tuple[int, ...]:
    """Array range text back to task ids: "[0-3,7%2]" and "0-3,7" -> (0, 1, 2, 3, 7);
    "0-6:3" (sbatch's step form) -> (0, 3, 6). ValueError on anything else.

    squeue shortens very long range lists with a trailing "..."; the piece it cut is
    dropped (it may be a number cut short), so the answer is then a prefix."""
    text = spec.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.partition("%")[0]
    pieces = text.split(",") if text else []
    if pieces and pieces[-1].endswith("..."):
        pieces.pop()
    ids: list[int] = []
    for piece in pieces:
        span, _, step_text = piece.partition(":")
        first, dash, last = span.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"not an array range: {spec!r}")
        if step_text and (not step_text.isdigit() or int(step_text) < 1):
            raise ValueError(f"not an array step: {spec!r}")
        step = int(step_text) if step_text else 1
        ids.extend(range(int(first), int(last if dash else first) + 1, step))
    return tuple(ids)


# -------------------------------------------------------------------------------- status

# -r: one line per array task, pending ones too (without it: "66|0-5%2|66|PENDING|None").
# %A is the task's own job id once it has one; the caller appends ["-j", "A1,A2"].
SQUEUE_ARGV: Final[list[str]] = ["squeue", "-r", "-h", "-t", "all", "-o", "%F|%K|%A|%T|%r"]
# The caller runs ["sacct", "-X" or "-c", "-n", "-P", "-j", IDS, "-o", SACCT_FIELDS]. With
# a database, IDS are the array ids. With -c (jobcomp/filetxt, Slurm 22.05) sacct knows no
# arrays: JobID is the task's own id, `-j ARRAY_ID` finds only the task that took that id,
# so IDS are the keys of tasks_by_job_id() and that map is parse_sacct's `known`.
SACCT_FIELDS: Final = "JobID,JobIDRaw,State,ExitCode"


@dataclass(frozen=True)
class TaskState:
    array_job_id: str
    task_id: int
    job_id: str  # the task's own job id when known, else ""
    state: str  # normalised Slurm state word, e.g. "PENDING", "CANCELLED"
    reason: str  # squeue %r, "" when None
    exit_code: Optional[int]  # sacct "3:0" -> 3, "0:15" -> 128+15; None when unknown


TaskKey = tuple[str, int]


@functools.lru_cache(maxsize=512)
def _state(word: str) -> str:
    # Cached: a 10,000-task listing holds a handful of distinct words.
    return states.parse(word).value


def _tasks(text: str) -> tuple[int, ...]:
    if text.isdigit():  # the common case, kept off the slow path
        return (int(text),)
    try:
        return expand(text)
    except ValueError:
        return ()  # "N/A": not an array task


def parse_squeue(text: str) -> dict[TaskKey, TaskState]:
    """Array tasks in SQUEUE_ARGV's output; other jobs are skipped.

    Tasks not started yet share one record, the array's own (%A = %F): no task owns that
    id until one task is left in it, which then runs under it."""
    rows: list[tuple[str, tuple[int, ...], str, str, str]] = []
    sharing: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.strip().split("|", 4)
        if len(fields) != 5:
            continue
        array_id, task_text, job_id, word, reason = fields
        tasks = _tasks(task_text)
        if tasks and array_id.isdigit():
            rows.append((array_id, tasks, job_id, word, "" if reason == "None" else reason))
            sharing[job_id] = sharing.get(job_id, 0) + len(tasks)
    found: dict[TaskKey, TaskState] = {}
    for array_id, tasks, job_id, word, reason in rows:
        own = job_id if sharing[job_id] == 1 and job_id.isdigit() else ""
        state = _state(word)
        for task in tasks:
            found[(array_id, task)] = TaskState(array_id, task, own, state, reason, None)
    return found


def tasks_by_job_id(tasks: Mapping[TaskKey, TaskState]) -> dict[str, list[TaskKey]]:
    """The job ids sacct -c knows these tasks by: a task's own id, else its array's id
    (the tasks still sharing the array's record). Keep it across refreshes (update it
    with each squeue answer): once a task ends, squeue forgets it after MinJobAge."""
    ids: dict[str, list[TaskKey]] = {}
    for key, task in tasks.items():
        ids.setdefault(task.job_id or task.array_job_id, []).append(key)
    return ids


def parse_sacct(
    text: str, known: Optional[Mapping[str, Sequence[TaskKey]]] = None
) -> dict[TaskKey, TaskState]:
    """Array tasks in `sacct -n -P -o SACCT_FIELDS` output; later records of a task win
    (a requeued task has several), steps and other jobs are skipped. Records without the
    array form (sacct -c) are placed by `known` (tasks_by_job_id), else skipped."""
    found: dict[TaskKey, TaskState] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 4 or "." in fields[0]:
            continue
        job, raw, word, code = fields[:4]
        array_id, sep, task_text = job.partition("_")
        if sep:
            keys = [(array_id, task) for task in _tasks(task_text)]
            # A bracket record is the pending remainder: its JobIDRaw is the array's id.
            own = raw if len(keys) == 1 and "[" not in task_text else ""
        elif known is not None and job in known:
            keys = list(known[job])
            own = job if len(keys) == 1 else ""
        else:
            continue
        state = _state(word)
        exit_code = None if state in _ACTIVE_WORDS else _exit_code(code)
        for key in keys:
            found[key] = TaskState(key[0], key[1], own, state, "", exit_code)
    return found


_ACTIVE_WORDS: Final = frozenset(state.value for state in states.ACTIVE)


def _exit_code(text: str) -> Optional[int]:
    """sacct's "code:signal": a signal means the shell's 128+N, else the code."""
    code, sep, signal = text.strip().partition(":")
    if not code.isdigit() or (sep and not signal.isdigit()):
        return None
    return 128 + int(signal) if sep and int(signal) else int(code)
