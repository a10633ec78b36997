"""What the console shows of a job above node_logs_above ranks: rank 0's lines, and the
lines of any other rank that look like a warning or an error, identical ones of many
ranks shown once with their ranks (`ranks 3, 13, 23 ... (8 ranks): CUDA out of memory`).

Lines of other ranks are held until no rank joined their text for `window_s` (at most
`HOLD_MAX_S`), so that the same error printed a little later by other ranks joins its line.
"""

from __future__ import annotations

import time
from typing import Callable

from hpclaunch.observe.nodelogs import LOOKS_BAD, show_ranks, split_tag

WINDOW_S = 2.0
HOLD_MAX_S = 10.0  # a line that ranks keep joining is shown after this long all the same


class _Held:
    __slots__ = ("first_s", "last_s", "node", "ranks")

    def __init__(self, first_s: float, node: str) -> None:
        self.first_s = self.last_s = first_s
        self.node = node  # the first rank's, shown when it stays alone
        self.ranks: list[int] = []


class ConsoleFilter:
    """Decides, line by line, what the console shows; `due` gives the grouped lines."""

    def __init__(
        self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window_s = window_s
        self._clock = clock
        self._held: dict[str, _Held] = {}  # text -> who printed it (insertion: first seen)

    def take(self, node: str, rank: int, text: str) -> bool:
        """True: show this line now (rank 0). Else the line is held (it looks like a
        warning or an error) or dropped (the node file keeps it)."""
        if rank == 0:
            return True
        if LOOKS_BAD.search(text):
            held = self._held.get(text)
            if held is None:
                held = self._held[text] = _Held(self._clock(), node)
            held.ranks.append(rank)
            held.last_s = self._clock()
        return False

    def due(self, final: bool = False) -> list[str]:
        """The held lines no rank joined for the window (all of them when `final`),
        untagged text with their ranks in front, in the order their text first came."""
        now = self._clock()
        lines = []
        for text, held in list(self._held.items()):
            quiet = now - held.last_s >= self._window_s
            if final or quiet or now - held.first_s >= HOLD_MAX_S:
                del self._held[text]
                lines.append(group_line(held.node, held.ranks, text))
        return lines


def group_line(node: str, ranks: list[int], text: str) -> str:
    """One rank: its usual tag; several: `ranks 3, 13, 23 ... (8 ranks): text`."""
    if len(set(ranks)) == 1:
        return f"[{node} {ranks[0]}] {text}"
    return f"{show_ranks(sorted(set(ranks)))}: {text}"


class NodeLines:
    """A node file's lines as one follower shows them: one rank's (`rank`), else what
    the console shows (ConsoleFilter); `due` gives the grouped lines."""

    def __init__(self, rank: int | None) -> None:
        self._rank = rank
        self._console = ConsoleFilter() if rank is None else None

    def shown(self, lines: list[bytes]) -> list[tuple[str, int, bytes]]:
        """(node, rank, text) of the lines to show now."""
        out = []
        for tagged in map(split_tag, lines):
            if tagged is None or (self._rank is not None and tagged[1] != self._rank):
                continue
            node, rank, text = tagged
            if self._console and not self._console.take(
                node, rank, text.decode("utf-8", "replace")
            ):
                continue
            out.append(tagged)
        return out

    def due(self, final: bool) -> list[str]:
        return self._console.due(final) if self._console else []
