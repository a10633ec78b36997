"""What the sweep tests share: how many spans overlap at most (no tests in here)."""

from __future__ import annotations


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of (start, end) spans running at the same moment."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    level = best = 0
    for _, step in edges:
        level += step
        best = max(best, level)
    return best
