"""A sweep of P points as Slurm job arrays: how to split it, whether it fits.

A sweep is ONE `sbatch --array` job, split only where the site forces it: every task id
must be < MaxArraySize (slurm.conf(5)). The job script computes `point = offset +
SLURM_ARRAY_TASK_ID`. Pure: the caller runs the Slurm commands named by the constants
below and passes their text in, so tests feed recorded output. What Slurm says of the
tasks (squeue -r, sacct) is parsed in slurm/arraytasks.py, re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Optional

from hpclaunch.errors import UserError

# The status of array tasks is the Slurm backend's; these names stay here for callers.
from hpclaunch.slurm.arraytasks import (
    SACCT_FIELDS,
    SQUEUE_ARGV,
    TaskKey,
    TaskState,
    expand,
    parse_sacct,
    parse_squeue,
    tasks_by_job_id,
)

# slurm.conf(5) defaults, used when `scontrol show config` does not print the key.
DEFAULT_MAX_ARRAY_SIZE: Final = 1001
DEFAULT_MAX_JOB_COUNT: Final = 10000

# ---------------------------------------------------------------------------- splitting


@dataclass(frozen=True)
class ArrayPart:
    """One `sbatch --array` job of a sweep."""

    offset: int  # point index = offset + SLURM_ARRAY_TASK_ID
    task_ids: tuple[int, ...]  # the array task ids (point - offset), sorted
    throttle: Optional[int]  # the %N of this part, None = no throttle

    def spec(self) -> str:
        """The --array value: runs compressed ("0-999%3", "3,7,10-12%2")."""
        text = compress(self.task_ids)
        return text if self.throttle is None else f"{text}%{self.throttle}"

    def points(self) -> tuple[int, ...]:
        return tuple(self.offset + task for task in self.task_ids)


def compress(ids: Iterable[int]) -> str:
    """Sorted task ids as Slurm's array range text: 0,1,2,3,7 -> "0-3,7"."""
    pieces: list[str] = []
    start = last = -2
    for task in ids:
        if task == last + 1:
            last = task
            continue
        if start >= 0:
            pieces.append(_span(start, last))
        start = last = task
    if start >= 0:
        pieces.append(_span(start, last))
    return ",".join(pieces)


def _span(start: int, last: int) -> str:
    return str(start) if start == last else f"{start}-{last}"


def split(
    points: Sequence[int], max_array_size: int, max_parallel: Optional[int]
) -> list[ArrayPart]:
    """The fewest arrays that run `points` (any subset of 0..P-1, e.g. a retry), in point
    order, with --max-parallel shared between them (see share_throttle).

    Offsets are multiples of max_array_size, so a point always lands in the same part
    and task ids stay < MaxArraySize as Slurm requires."""
    if max_array_size < 1:
        raise UserError(
            "sweep",
            "this cluster accepts no job arrays",
            limit="MaxArraySize 0",
            fix="Ask the site admins to set MaxArraySize in slurm.conf",
        )
    wanted = sorted(set(points))
    if wanted and wanted[0] < 0:
        raise UserError("points", f"point {wanted[0]} is negative", fix="Points start at 0")
    groups: dict[int, list[int]] = {}
    for point in wanted:
        offset = point - point % max_array_size
        groups.setdefault(offset, []).append(point - offset)
    if max_parallel is not None and 1 <= max_parallel < len(groups):
        raise UserError(
            "--max-parallel",
            f"the sweep needs {len(groups)} job arrays (MaxArraySize {max_array_size}) "
            "and each runs at least one point at a time",
            limit=f"{max_parallel} < {len(groups)}",
            fix=f"Use --max-parallel {len(groups)} or more, or fewer points per sweep",
        )
    throttles = share_throttle(max_parallel, [len(ids) for ids in groups.values()])
    return [
        ArrayPart(offset, tuple(ids), throttle)
        for (offset, ids), throttle in zip(groups.items(), throttles)
    ]


def share_throttle(total: Optional[int], sizes: Sequence[int]) -> list[Optional[int]]:
    """--max-parallel `total` shared between arrays of `sizes` tasks.

    Every part gets 1, the rest is shared in proportion to what each part can still use
    (size - 1), and what rounding leaves over goes to the first parts. A share never
    exceeds its part's size (a %N above the size throttles nothing and would hide
    slots from the other parts), so the sum is min(total, sum(sizes)), never more than
    total. UserError when total < len(sizes): each array runs at least one task."""
    if total is None:
        return [None] * len(sizes)
    if total < 1:
        raise UserError("--max-parallel", f"{total} runs nothing", limit="at least 1")
    if any(size < 1 for size in sizes):
        raise ValueError(f"array sizes must be >= 1: {list(sizes)}")
    count = len(sizes)
    if total < count:
        raise UserError(
            "--max-parallel",
            f"the sweep needs {count} job arrays and each runs at least one point at a time",
            limit=f"{total} < {count}",
            fix=f"Use --max-parallel {count} or more",
        )
    room = sum(sizes) - count
    budget = min(total, sum(sizes)) - count  # <= room, so no floor below exceeds its size
    shares = [1 + (budget * (size - 1) // room if room else 0) for size in sizes]
    left = budget - (sum(shares) - count)
    while left > 0:  # fewer than `count` slots left; room remains since budget <= room
        for i, size in enumerate(sizes):
            if left > 0 and shares[i] < size:
                shares[i] += 1
                left -= 1
    return list(shares)


# -------------------------------------------------------------------------- site limits

# The caller formats {user} and runs this; no accounting database (sacctmgr fails or
# prints nothing) means max_submit_jobs=None. The QOS limit MaxSubmitJobsPerUser is not
# read: which QOS a job gets depends on the request, and sbatch's refusal names it.
SACCTMGR_ARGV_TEMPLATE: Final[list[str]] = [
    "sacctmgr", "-n", "-P", "show", "assoc", "where", "user={user}",
    "format=Cluster,Account,User,Partition,MaxSubmit",
]  # fmt: skip

# Counting the user's own jobs against MaxSubmitJobs for check_fits (pending and running;
# count the non-empty lines): [*SQUEUE_COUNT_ARGV, "-u", user]. -r: slurmctld counts each
# array task as a job, so a pending array must count once per task. MaxJobCount is
# checked against sdiag's counters instead (limits.queued_jobs), never a listing.
SQUEUE_COUNT_ARGV: Final[list[str]] = ["squeue", "-h", "-r", "-o", "%i"]


def sacctmgr_argv(user: str) -> list[str]:
    return [arg.replace("{user}", user) for arg in SACCTMGR_ARGV_TEMPLATE]


@dataclass(frozen=True)
class SiteLimits:
    max_array_size: int  # scontrol show config MaxArraySize (default 1001 when absent)
    max_job_count: int  # MaxJobCount (default 10000)
    max_submit_jobs: Optional[int]  # from sacctmgr when an accounting database answers


def parse_config(text: str) -> tuple[int, int]:
    """(MaxArraySize, MaxJobCount) from `scontrol show config` text."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config.setdefault(key.strip(), value.strip())
    return limits_from_config(config)


def limits_from_config(config: Mapping[str, str]) -> tuple[int, int]:
    """The same from an already parsed config (discover.slurm_config(): no second call)."""
    return (
        _count(config.get("MaxArraySize"), DEFAULT_MAX_ARRAY_SIZE),
        _count(config.get("MaxJobCount"), DEFAULT_MAX_JOB_COUNT),
    )


def _count(text: Optional[str], default: int) -> int:
    # MaxArraySize = 0 is meaningful (arrays disabled), so only a missing value defaults.
    return int(text) if text is not None and text.strip().isdigit() else default


def parse_max_submit(
    text: str,
    user: str,
    account: Optional[str],
    partition: Optional[str],
    *,
    cluster: Optional[str] = None,
) -> Optional[int]:
    """MaxSubmit of the user's most specific association in SACCTMGR_ARGV_TEMPLATE's output
    (user+account+partition > user+account > user); None = no limit (empty MaxSubmit).

    account/partition None (the job takes the user's defaults, unknown here): rows of any
    account/partition qualify, and among equally specific rows the lowest limit counts,
    so that a refusal here is never one sbatch would not make for some default."""
    best = -1  # the score below, -1 = no row yet
    limits: list[Optional[int]] = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.split("|")]
        if len(fields) < 5 or fields[2] != user:
            continue
        row_cluster, row_account, _, row_partition, max_submit = fields[:5]
        if cluster is not None and row_cluster != cluster:
            continue
        if account is not None and row_account != account:
            continue
        if row_partition and partition is not None and row_partition != partition:
            continue
        score = 2 * (account is not None) + (bool(row_partition) and partition is not None)
        value = int(max_submit) if max_submit.isdigit() else None
        if score > best:
            best, limits = score, [value]
        elif score == best:
            limits.append(value)
    numbers = [value for value in limits if value is not None]
    return min(numbers) if numbers else None


def check_fits(points: int, limits: SiteLimits, queued_now: Optional[int]) -> None:
    """UserError when slurmctld would refuse `points` array tasks: each counts as one job.

    queued_now counts array tasks one by one: the user's own jobs when
    limits.max_submit_jobs is set, else the jobs slurmctld holds (limits.queued_jobs);
    None: not known, only what never fits is refused."""
    if points >= limits.max_job_count:  # never fits, whatever is queued
        raise UserError(
            "sweep",
            f"{points} points do not fit the cluster's job table",
            limit=f"MaxJobCount {limits.max_job_count}",
            fix="Run fewer points per sweep (split the --configs)",
        )
    if queued_now is None:
        return
    if limits.max_submit_jobs is not None:
        if points > limits.max_submit_jobs - queued_now:
            raise UserError(
                "sweep",
                f"{points} points do not fit what one user may queue",
                limit=f"MaxSubmitJobs {limits.max_submit_jobs}, {queued_now} already queued",
                fix="Run fewer points per sweep (split the --configs), wait for queued "
                "jobs to end, or ask the site admins for a higher MaxSubmitJobs",
            )
        return
    # slurmctld refuses when job count + new tasks reaches MaxJobCount (job_mgr.c).
    if points > limits.max_job_count - 1 - queued_now:
        raise UserError(
            "sweep",
            f"{points} points do not fit the cluster's job table now",
            limit=f"MaxJobCount {limits.max_job_count}, {queued_now} jobs held by all users",
            fix="Run fewer points per sweep (split the --configs) or wait for jobs to end",
        )


__all__ = [
    "DEFAULT_MAX_ARRAY_SIZE",
    "DEFAULT_MAX_JOB_COUNT",
    "SACCTMGR_ARGV_TEMPLATE",
    "SACCT_FIELDS",
    "SQUEUE_ARGV",
    "SQUEUE_COUNT_ARGV",
    "ArrayPart",
    "SiteLimits",
    "TaskKey",
    "TaskState",
    "check_fits",
    "compress",
    "expand",
    "limits_from_config",
    "parse_config",
    "parse_max_submit",
    "parse_sacct",
    "parse_squeue",
    "sacctmgr_argv",
    "share_throttle",
    "split",
    "tasks_by_job_id",
]
