"""Helpers for checking what examples/ddp_train.py saved (`--save`); no tests in here.

Each saved file is JSON: {"rank": R, "world_size": W, "host": str,
"params": {name: [float, ...]}}. A correct W-rank run leaves W files with the same
parameters on every rank (DDP keeps the replicas in lock-step), and those equal a
one-process run over the same global batches up to float rounding.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Union

PathLike = Union[str, Path]


def load_params(paths: list[PathLike]) -> list[dict[str, Any]]:
    """Load each saved record, in the order given; a missing file fails with its name."""
    records = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise AssertionError(f"parameter file {path} was not written")
        records.append(json.loads(path.read_text()))
    return records


def _max_abs_diff(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    if a.keys() != b.keys():
        raise AssertionError(f"parameter names differ: {sorted(a)} vs {sorted(b)}")
    worst = 0.0
    for name in a:
        if len(a[name]) != len(b[name]):
            raise AssertionError(f"{name}: {len(a[name])} values vs {len(b[name])}")
        for x, y in zip(a[name], b[name]):
            worst = max(worst, abs(x - y) if math.isfinite(x - y) else math.inf)
    return worst


def assert_params_equal_reference(
    param_files: list[Path], reference_file: Path, atol: float = 1e-5
) -> None:
    """All ranks wrote their file, agree exactly, and match the 1-rank reference within atol."""
    records = load_params(list(param_files))
    assert records, "no parameter files given"
    world = records[0]["world_size"]
    ranks = sorted(r["rank"] for r in records)
    assert ranks == list(range(world)), f"ranks {ranks} in files, expected 0..{world - 1}"
    assert all(r["world_size"] == world for r in records), "files disagree on world_size"

    first = records[0]
    for r in records[1:]:
        diff = _max_abs_diff(first["params"], r["params"])
        assert diff == 0.0, f"rank {r['rank']} differs from rank {first['rank']} by {diff:g}"

    (ref,) = load_params([reference_file])
    assert ref["world_size"] == 1, f"reference {reference_file} has world_size {ref['world_size']}"
    diff = _max_abs_diff(ref["params"], first["params"])
    assert diff <= atol, f"{world}-rank parameters differ from the 1-rank reference by {diff:g}"
