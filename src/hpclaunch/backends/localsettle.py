"""Local jobs another process supervises: cancelling them, and settling the record of one
whose launcher is gone (SIGKILLed, the machine rebooted), from the reaper's facts.

A local sweep's points all have one launcher, the sweep's runner (`hpclaunch sweep`
in the foreground): a point is cancelled through its record (the runner starts no point
so marked, and records a running one's end as CANCELLED) and its task groups, never by
ending the runner, which goes on with the other points.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import Any, Optional

from hpclaunch.backends.localreaper import LAUNCHER_GONE, launcher_alive, launcher_gone
from hpclaunch.basics import states
from hpclaunch.records import runrecord
from hpclaunch.records.runrecord import RunRecord

CANCEL_REQUESTED = "cancel_requested"  # in a point's run.json: its runner ends it
NOT_STARTED = "cancelled before it started"


def cancel_recorded(pid: Optional[int], started: Optional[float], pgids: Sequence[int]) -> bool:
    """Cancel a local run another process supervises: SIGTERM its launcher, which ends
    the tasks and records the end; when the launcher is gone, end the task groups."""
    if launcher_alive(pid, started):
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        return True
    return _end_groups(pgids)


def _end_groups(pgids: Sequence[int]) -> bool:
    ended = False
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGTERM)
            ended = True
        except OSError:
            pass
    return ended


def cancel_point(record: RunRecord) -> bool:
    """One point of a local sweep: a pending one is CANCELLED in its record (its runner
    will not start it), a running one is marked and its task groups are ended."""
    cancelled = states.State.CANCELLED

    def decide(data: dict[str, Any]) -> Optional[dict[str, Any]]:
        state = str(data.get("state") or "")
        if state in (states.State.CREATED, states.State.PENDING):
            code = states.exit_code_for(cancelled)
            return {"state": cancelled.value, "exit_code": code, "reason": NOT_STARTED}
        if states.is_active(states.parse(state)):
            return {CANCEL_REQUESTED: True}
        return None

    changes = runrecord.update_with(record.path, decide)
    if changes is None:
        return False
    if CANCEL_REQUESTED in changes:  # no groups yet: the runner sees the mark once it has them
        _end_groups(runrecord.load(record.path).pgids)
    return True


def settled(record: RunRecord) -> dict[str, object]:
    """A local run (or point) recorded as open whose launcher is gone did not run on: its
    reaper ended the ranks. The changes that say so (empty while it lives)."""
    pid = record.launcher_pid
    if pid is None:
        return {}
    gone = launcher_gone(pid, record.launcher_started)
    if gone is None:
        return {}
    ended = _ranks_ended(record)
    if ended is not None:  # its end was not recorded (a full disk): the ranks tell it
        return ended
    reason = f"hpclaunch (pid {pid}) ended before the run; its ranks were ended"
    if gone != "ended":
        reason += f" ({gone})"
    return {
        "state": states.State.CANCELLED.value,
        "exit_code": states.exit_code_for(states.State.CANCELLED),
        "reason": reason,
    }


def _ranks_ended(record: RunRecord) -> Optional[dict[str, object]]:
    """A local run whose every rank exited 0, the end its launcher could not write (a
    full disk): COMPLETED. Ranks that failed or were killed could also have been ended by
    the reaper, whose own event may not be written yet: those stay CANCELLED."""
    found = record.events
    size = record.world_size
    if not size or len(found.returncodes) < size or found.attempts:
        return None
    if any(found.returncodes.values()):
        return None
    if any(e.get("event") == LAUNCHER_GONE for e in runrecord.event_lines(record.path)):
        return None
    return {"state": states.State.COMPLETED.value, "exit_code": 0, "ended_at": found.last_end}
