"""What a backend would start, nothing started: its own request and how a --dry-run shows
it (learnt from torchx's Scheduler.submit_dryrun -> AppDryRunInfo: the request is a pure
value, scheduling it is a separate act).

Each backend renders its own: Slurm the job script and the sbatch line (render.BatchPlan),
a step of an allocation its srun line, the local backend the command and the environment
of every rank (backends/local.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class DryRun(Generic[R]):
    request: R  # what the backend's start() acts on
    text: str  # what --dry-run prints (secret values only as $NAME)
    data: Mapping[str, Any]  # the fields --dry-run --json adds (secret values as $NAME)
