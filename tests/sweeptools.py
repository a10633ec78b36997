"""What the sweep tests share: how many spans overlap at most, a study's trials as
rows (no tests in here)."""

from __future__ import annotations

from pathlib import Path


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of (start, end) spans running at the same moment."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    level = best = 0
    for _, step in edges:
        level += step
        best = max(best, level)
    return best


def trial_rows(sweep_dir: Path, study_name: str) -> list[dict[str, object]]:
    """Every trial in the sweep's journal as {"number", "state", "params", "value",
    "point"}, by number: what the tests read back (hpclaunch itself never lists them)."""
    import optuna

    from hpclaunch.sweeps import trials

    if not (sweep_dir / trials.JOURNAL).exists():
        return []
    study = optuna.load_study(study_name=study_name, storage=trials.storage(sweep_dir))
    return [
        {
            "number": t.number,
            "state": t.state.name,
            "params": dict(t.params),
            "value": t.value,
            "point": t.user_attrs.get(trials.POINT),
        }
        for t in study.get_trials(deepcopy=False)
    ]
