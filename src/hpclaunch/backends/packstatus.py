"""A packed sweep's points (`sweep --pack`) brought up to date: a point is no job of its
own but a run in a slot of the pack's allocation, so its state comes from its own events
(the node agent's point_start / point_end, node/pack_agent.py) and the allocation's state
(the same one status call every point of the refresh shares):

- ended (point_end): COMPLETED, FAILED or CANCELLED by its exit code and reason;
- started, the allocation active: RUNNING, with its node, slot and GPUs as the reason;
- not started, the allocation active: PENDING (queued in the pack);
- the allocation ended first: started -> FAILED "node lost" (its agent went with its node,
  or the allocation ended under it), never started -> CANCELLED "never started".

A point's record names the pack's array job (its `job_id`, "123"); the allocation that ran
it is the array task its point_start names ("123_1"), else the first.
"""

from __future__ import annotations

from typing import Any, Optional

from hpclaunch.basics import states
from hpclaunch.observe.jobend import JobStatus
from hpclaunch.records import runrecord
from hpclaunch.records.runpaths import CANCELLED_FILE
from hpclaunch.records.runrecord import RunRecord

PACKED = "packed"  # a packed point's record key (True)
NODE_LOST = "node lost"
NEVER_STARTED = "never started (the pack ended first)"


def is_packed(record: RunRecord) -> bool:
    return bool(record.extra.get(PACKED))


def _event(record: RunRecord, kind: str) -> Optional[dict[str, Any]]:
    return runrecord.job_event(record.path, kind, str(record.job_id))


def allocation(record: RunRecord) -> str:
    """The array task whose allocation runs (or would run) the point."""
    start = _event(record, runrecord.JOB_START)
    task = (start or {}).get("task")
    return str(task) if task else f"{record.job_id}_0"


def ended(end: dict[str, Any]) -> dict[str, Any]:
    """The agent's word on a point's end."""
    code = int(end.get("exit_code", 1))
    reason = str(end.get("reason") or "")
    state = states.State.COMPLETED if code == 0 else states.State.FAILED
    if reason == "cancelled":
        state = states.State.CANCELLED
    out: dict[str, Any] = {"state": state.value, "exit_code": code, "ended_at": end.get("time")}
    if reason:
        out["reason"] = reason
    return out


def changes(record: RunRecord, status: Optional[JobStatus]) -> dict[str, Any]:
    """What a refresh learns of a packed point (empty: nothing new)."""
    end = _event(record, runrecord.JOB_END)
    if end is not None:
        return ended(end)
    if status is None:
        return {}
    start = _event(record, runrecord.JOB_START)
    state = states.parse(status.state)
    if states.is_active(state) or state == states.State.UNKNOWN:
        if start is None:
            return {"state": states.State.PENDING.value, "reason": status.reason or "queued"}
        gpus = ",".join(str(g) for g in start.get("gpus") or []) or "-"
        where = f"node {start.get('node')} slot {start.get('slot')} gpus {gpus}"
        return {"state": states.State.RUNNING.value, "reason": where}
    if start is None:
        cancelled = states.State.CANCELLED
        code = states.exit_code_for(cancelled.value)
        return {"state": cancelled.value, "exit_code": code, "reason": NEVER_STARTED}
    failed = states.State.FAILED
    return {"state": failed.value, "exit_code": 1, "reason": NODE_LOST}


def cancel_point(record: RunRecord, queue: Any, done: Any) -> bool:
    """`cancel SWEEP:I` of a packed point: its slot goes on. A queued point leaves the
    queue (CANCELLED now); a running one gets the marker its agent ends it on."""
    index = str(record.extra.get("point"))
    try:
        (queue / index).rename(done / index)
    except OSError:  # taken (running) or gone: the agent ends it on the marker
        (record.path / CANCELLED_FILE).touch()
        return True
    cancelled = states.State.CANCELLED
    runrecord.update(
        record.path, state=cancelled.value, exit_code=states.exit_code_for(cancelled.value),
        reason="cancelled before it started",
    )  # fmt: skip
    return True
