"""A requeued run's attempts, folded from the events its batch shell appended.

The batch shell of a `--requeue` run writes `attempt_start` (attempt, job id, nodes) and
`attempt_end` (reason, why, exit code) to events.jsonl (script/requeue.py); Slurm's own
requeues (a node failure, a preemption without the signal) leave an attempt with no end
of its own, followed by the next attempt's start. No I/O here: runrecord.py reads the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Optional

# attempt_end reasons, as the batch shell writes them (script/requeue.py's text)
REQUEUED, ENDED, DONE, BUDGET, CANCELLED, REQUEUE_FAILED = (
    "requeued",
    "ended",
    "done",
    "budget",
    "cancelled",
    "requeue-failed",
)

_REASONS = {
    ENDED: "ended",
    DONE: "done: the program wrote its done marker",
    CANCELLED: "cancelled while being requeued",
    REQUEUE_FAILED: "scontrol requeue failed",
}
_WHY = {"time-limit": "time limit", "preempted": "preempted", "bad-node": "bad nodes excluded"}


@dataclass(frozen=True)
class Attempt:
    number: int
    job_id: str = ""
    nodes: str = ""
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    reason: str = ""  # as the batch shell wrote it (REQUEUED, ...); "" no end seen
    why: str = ""  # time-limit | preempted
    exit_code: Optional[int] = None  # the ranks' step, as the batch shell saw it

    def describe(self, last: bool, budget: Optional[int] = None) -> str:
        """How the attempt ended, in words ("" for the last one while it has no end);
        `budget`: the run's --max-requeues, named when the budget ended it."""
        why = _WHY.get(self.why, self.why)
        if self.reason == REQUEUED:
            return f"requeued by hpclaunch ({why})" if why else "requeued by hpclaunch"
        if self.reason == BUDGET:
            given = "" if budget is None else f" (--max-requeues {budget})"
            spent = f"the requeue budget{given} is spent"
            return f"stopped: {spent} ({why})" if why else f"stopped: {spent}"
        if self.reason:
            return _REASONS.get(self.reason, self.reason)
        # No end of its own: Slurm ended this attempt itself and started the next one.
        return "" if last else "requeued by Slurm"

    def to_dict(self, last: bool) -> dict[str, Any]:
        return {**asdict(self), "ended": self.describe(last)}


def fold(events: Iterable[Mapping[str, Any]]) -> list[Attempt]:
    """Attempts in order; for each, the last start and the last end seen win."""
    found: dict[int, dict[str, Any]] = {}
    for event in events:
        kind, number = event.get("event"), event.get("attempt")
        if kind not in ("attempt_start", "attempt_end") or not isinstance(number, int):
            continue
        entry = found.setdefault(number, {"number": number})
        when = event.get("time")
        when = float(when) if isinstance(when, (int, float)) else None
        if kind == "attempt_start":
            entry.update(
                job_id=str(event.get("job_id", "")),
                nodes=str(event.get("nodes", "")),
                started_at=when,
            )
        else:
            code = event.get("exit_code")
            entry.update(
                ended_at=when,
                reason=str(event.get("reason", "")),
                why=str(event.get("why", "")),
                exit_code=code if _is_int(code) else None,
            )
    return [Attempt(**found[n]) for n in sorted(found)]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def summary(attempts: list[Attempt]) -> list[str]:
    """One line per attempt, for `status` and `show`."""
    lines = []
    for attempt in attempts:
        last = attempt is attempts[-1]
        ended = attempt.describe(last) or "running or ended (see the state)"
        code = "" if attempt.exit_code is None else f", exit {attempt.exit_code}"
        where = f" on {attempt.nodes}" if attempt.nodes else ""
        lines.append(f"attempt {attempt.number}: job {attempt.job_id}{where}: {ended}{code}")
    return lines
