"""What an Optuna sweep's array script runs on the point's batch host, outside any
container, with the hpclaunch that submitted:

    python -m hpclaunch.sweeps.pointcmd ask  SWEEP_DIR POINT TASK   (before the program)
    python -m hpclaunch.sweeps.pointcmd tell SWEEP_DIR POINT EXIT_CODE

`ask` gets the point its trial (a requeued point its own again), marks trials of points
that died without telling FAIL (one squeue call says which are still queued or running),
and writes the point's params.env and params.json. `tell` reports the point's result
(rank 0's result.json) or FAIL. Both say what went wrong on stderr (the point's log).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpclaunch.basics import states
from hpclaunch.errors import HpclaunchError
from hpclaunch.records import runrecord, sweeprecord
from hpclaunch.slurm import commands
from hpclaunch.sweeps import arrays, script
from hpclaunch.sweeps.points import Point
from hpclaunch.sweeps.space import SpaceParam


def space_of(data: dict[str, Any]) -> tuple[SpaceParam, ...]:
    """The search space as recorded at submission (the user's file may have changed)."""
    found = []
    for entry in data.get("space") or []:
        entry = dict(entry)
        entry["choices"] = tuple(entry.get("choices") or ())
        found.append(SpaceParam(**entry))
    return tuple(found)


def alive_points(data: dict[str, Any]) -> Any:
    """alive(indices) for trials.ask: which of those points Slurm still holds (one call)."""

    if data.get("pack"):  # a packed sweep's: taken by a slot and not done (no squeue)
        from hpclaunch.sweeps import packplan

        return packplan.running_points(Path(str(data["sweep_dir"])))

    def alive(indices: Sequence[int]) -> set[int]:
        offsets = {str(a["job_id"]): int(a["offset"]) for a in data.get("arrays") or []}
        if not offsets:
            return set()
        out = commands.query([*arrays.SQUEUE_ARGV, "-j", ",".join(offsets)], timeout=30)
        if out is None:  # Slurm does not answer: fail nobody on a guess
            return set(indices)
        tasks = arrays.parse_squeue(out).values()
        held = {
            offsets[t.array_job_id] + t.task_id
            for t in tasks
            if t.array_job_id in offsets and states.is_active(states.parse(t.state))
        }
        return {i for i in indices if i in held}

    return alive


def ask(sweep_dir: Path, point: int, task: str) -> None:
    from hpclaunch.sweeps import trials

    data = sweeprecord.load(sweep_dir)
    sweep_id = str(data["sweep_id"])
    number, params = trials.ask(
        sweep_dir, sweep_id, space_of(data), point, task, alive_points(data)
    )
    asked = Point(point, {k: v for k, v in params.items() if v is not None})
    folder = sweeprecord.point_dir(sweep_dir, point)
    text = script.params_env(sweep_id, len(data["points"]), asked)
    (folder / sweeprecord.PARAMS_ENV).write_text(text, encoding="utf-8")
    runrecord.write_json(folder / sweeprecord.PARAMS_JSON, dict(asked.params))
    runrecord.update(folder, params=dict(asked.params), trial=number)
    print(f"hpclaunch: point {point}: Optuna trial {number}: {dict(asked.params)}", file=sys.stderr)


def tell(sweep_dir: Path, point: int, exit_code: int) -> None:
    from hpclaunch.sweeps import trials

    data = sweeprecord.load(sweep_dir)
    metric = str((data.get("sweep") or {}).get("metric") or "")
    folder = sweeprecord.point_dir(sweep_dir, point)
    told = trials.tell(
        sweep_dir, str(data["sweep_id"]), point, exit_code, sweeprecord.result(folder), metric
    )
    print(f"hpclaunch: point {point}: told Optuna {told}", file=sys.stderr)


def main(argv: Sequence[str]) -> int:
    try:
        if len(argv) == 4 and argv[0] == "ask":
            ask(Path(argv[1]), int(argv[2]), argv[3])
        elif len(argv) == 4 and argv[0] == "tell":
            tell(Path(argv[1]), int(argv[2]), int(argv[3]))
        else:
            print("usage: pointcmd ask DIR POINT TASK | tell DIR POINT EXIT_CODE", file=sys.stderr)
            return 2
    except (HpclaunchError, OSError, ValueError) as exc:
        print(f"hpclaunch: {argv[0] if argv else 'pointcmd'}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
