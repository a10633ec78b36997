"""submitit's side of bench/sweep.py, run as its own process (one per rep).

    python bench/sweep_submitit.py FOLDER POINTS PARTITION JOB_NAME

Submits POINTS calls of a tiny function as ONE held array with `map_array`, as a user
script would (import, executor, parameters, map_array), and prints two JSON lines:

  1. right after map_array returns: {"job_id", "import_s", "map_s"}
     (the harness times the process from its start to this line, as it times
     `hpclaunch sweep` to the printed sweep id)
  2. after one status refresh: {"refresh_s", "refresh_calls", "states_calls", "states"}

Scheduler calls are counted from the log the harness's shims append to
(SWEEPBENCH_CALLS, one line per call; unset = not counted): `refresh_calls` names the
commands run by one forced `watcher.update()` (what every submitit status refresh
runs, for all registered jobs at once), `states_calls` those run when then reading the
state of all POINTS jobs (`job.state`, served from the watcher's cache).
The job is submitted with `--hold` and never runs; the harness cancels it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter

T_START = time.perf_counter()


def point(i: int) -> int:
    """What each array task would run (never runs: the array is held)."""
    return i * i


def calls() -> list[str]:
    """The commands logged so far (first word of each line)."""
    log = os.environ.get("SWEEPBENCH_CALLS")
    if not log or not os.path.exists(log):
        return []
    with open(log) as f:
        return [line.split(" ", 1)[0] for line in f if line.strip()]


def main() -> int:
    folder, points, partition, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    import submitit

    t_import = time.perf_counter() - T_START
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(
        name=name,
        nodes=1,
        tasks_per_node=1,
        timeout_min=5,
        slurm_partition=partition,
        slurm_additional_parameters={"hold": True},
    )
    t0 = time.perf_counter()
    jobs = ex.map_array(point, range(points))
    t_map = time.perf_counter() - t0
    job_id = str(jobs[0].job_id).split("_")[0]
    first = {"job_id": job_id, "import_s": t_import, "map_s": t_map, "jobs": len(jobs)}
    print(json.dumps(first), flush=True)

    before = calls()
    t0 = time.perf_counter()
    jobs[0].watcher.update()  # a status refresh: one query for every registered job
    t_refresh = time.perf_counter() - t0
    mid = calls()
    states = Counter(job.state for job in jobs)  # within the watcher's delay: cached
    after = calls()
    second = {
        "refresh_s": t_refresh,
        "refresh_calls": mid[len(before) :],
        "states_calls": after[len(mid) :],
        "states": dict(states),
    }
    print(json.dumps(second), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
