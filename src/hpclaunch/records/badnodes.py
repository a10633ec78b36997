"""A run's bad nodes (--preflight, --spares), folded from the events its job appended.

node/preflight.py appends `node_bad` (node, why: a failed check or a node fault) and the
batch shell `step_restart` (the ranks' step again on a spare, the nodes lost) and
`exclude` (the nodes a later attempt or chain member excludes: the user's --exclude and
every bad node so far), script/badnodes.py's text. No I/O here: runrecord.py reads the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

NODE_BAD, STEP_RESTART, EXCLUDE = "node_bad", "step_restart", "exclude"


@dataclass
class BadNodes:
    bad: dict[str, str] = field(default_factory=dict)  # node -> why, first reason kept
    restarts: list[dict[str, Any]] = field(default_factory=list)  # {"attempt", "try", "lost"}
    exclude: str = ""  # the last exclusion carried to a later attempt, "" none

    def to_dict(self) -> dict[str, Any]:
        """The record's keys (none when nothing went wrong)."""
        data: dict[str, Any] = {}
        if self.bad:
            data["bad_nodes"] = dict(self.bad)
        if self.restarts:
            data["step_restarts"] = list(self.restarts)
        if self.exclude:
            data["exclude"] = self.exclude
        return data

    def lines(self) -> list[str]:
        """For `status`: one line each, labelled as its other lines are."""
        out = [f"{'bad node':10} {node}: {why}" for node, why in sorted(self.bad.items())]
        for restart in self.restarts:
            out.append(
                f"{'spare':10} attempt {restart['attempt']}: the ranks' step restarted in "
                f"the same job (try {restart['try']}) after {restart['lost']} failed"
            )
        if self.exclude:
            out.append(f"{'excluded':10} {self.exclude} (from later attempts)")
        return out


def fold(events: Iterable[Mapping[str, Any]]) -> BadNodes:
    found = BadNodes()
    for event in events:
        kind = event.get("event")
        if kind == NODE_BAD and isinstance(event.get("node"), str):
            found.bad.setdefault(event["node"], str(event.get("why", "")))
        elif kind == STEP_RESTART:
            found.restarts.append(
                {
                    "attempt": event.get("attempt", 0),
                    "try": event.get("try", 0),
                    "lost": str(event.get("lost", "")),
                }
            )
        elif kind == EXCLUDE and event.get("nodes"):
            found.exclude = str(event["nodes"])
    return found
