"""Planning a job of many nodes with the Slurm answers it needs replayed in-process
(tests/slurm_replay.py): the testbed's recorded `scontrol show config`, and its recorded
`sinfo` partition line with the node count and shape of a big machine (the same format,
the same command line). Shared by tests/test_scale_plan.py and bench/scaleplan.py.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from hpclaunch import launching
from hpclaunch.slurm import commands, discover
from slurm_replay import Recorded, SlurmReplay, recorded

TASKS_PER_NODE = 8
# A node of the big machine: 64 cores, 8 GPUs, 512 GB (LUMI-G-like).
CPUS, GPUS, MEMORY_MB = 64, 8, 512000


def partition_answer(nodes: int) -> Recorded:
    """The recorded sinfo partitions answer (%P|%l|%D|%c|%G|%m|%s|%d|%L), its default
    partition with `nodes` nodes of the shape above."""
    real = recorded("sinfo_partitions")
    name, limit, _, _, _, _, *rest = real.stdout.splitlines()[0].split("|")
    line = "|".join([name, limit, str(nodes), str(CPUS), f"gpu:{GPUS}", str(MEMORY_MB), *rest])
    return Recorded(real.name, real.argv, 0, line + "\n", "")


def install(replay: SlurmReplay, nodes: int, setattr_: Callable[[Any, str, Any], None]) -> None:
    """Slurm's commands answered by `replay` (config + a `nodes`-node partition); with
    `setattr_` = monkeypatch.setattr in tests, plain setattr in the bench."""
    replay.answer("scontrol_show_config")
    found = partition_answer(nodes)
    replay.answers[found.argv] = found
    setattr_(commands, "run", replay.run)
    setattr_(commands, "query", replay.query)
    real_which = shutil.which  # slurm_config asks only where sbatch exists
    # (discover.shutil is this shutil: the replay's tests patch it the same way)
    setattr_(shutil, "which", lambda n, *a, **k: n if n == "sbatch" else real_which(n))


def plan(nodes: int, cwd: Path, environ: Mapping[str, str], **options: Any) -> tuple[float, str]:
    """Seconds to plan, validate and render `nodes` x TASKS_PER_NODE ranks (what
    `hpclaunch run --dry-run` prints), Slurm asked afresh; and the dry-run text."""
    discover.slurm_config.cache_clear()
    discover.partitions.cache_clear()
    values = {"cluster": "slurm", "nodes": nodes, "tasks_per_node": TASKS_PER_NODE}
    values.update(gpus_per_node=GPUS, no_snapshot=True, **options)
    request = launching.LaunchRequest(values, ("python", "train.py"), cwd, environ)
    start = time.perf_counter()
    planned = launching.plan_run(request)
    text = launching.preview(planned, environ, False)
    return time.perf_counter() - start, text
