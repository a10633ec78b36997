"""A sweep against the site's limits, as Slurm states them: MaxArraySize and MaxJobCount
(the cached `scontrol show config`), MaxSubmitJobs (sacctmgr, where an accounting database
answers), and how many jobs already count against the one that applies (asked only when
the sweep is large against it: one counter, never a listing of every user's jobs)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Optional

from hpclaunch.basics import users
from hpclaunch.config import layering
from hpclaunch.slurm import along, commands, discover
from hpclaunch.sweeps import arrays

if TYPE_CHECKING:
    from hpclaunch.launching import LaunchRequest


SACCTMGR_TIMEOUT_S = 10.0


def asking_limits(environ: Mapping[str, str]) -> AbstractContextManager[None]:
    """Around planning: site_limits' sacctmgr query starts with planning's scontrol and
    sinfo (slurm/along.py), where the plan asks Slurm at all."""
    user = users.user_name(environ)
    return along.asked_along(arrays.sacctmgr_argv(user), SACCTMGR_TIMEOUT_S)


def site_limits(req: LaunchRequest) -> arrays.SiteLimits:
    """MaxArraySize and MaxJobCount (the cached `scontrol show config`), MaxSubmitJobs
    where an accounting database answers sacctmgr."""
    max_array, max_jobs = arrays.limits_from_config(discover.slurm_config() or {})
    user = users.user_name(req.environ)
    answer = along.answer(arrays.sacctmgr_argv(user), SACCTMGR_TIMEOUT_S)  # with sinfo
    given = layering.cli_options(req.options)  # typed, as `run` reads them (checked by plan)
    account, partition = given.account, given.partition
    max_submit = (
        arrays.parse_max_submit(answer, user, account, partition) if answer is not None else None
    )
    return arrays.SiteLimits(max_array, max_jobs, max_submit)


# A sweep below this share of MaxJobCount is not checked against others' jobs (a call on
# every sweep; sbatch refuses the rare one that does not fit, naming MaxJobCount).
LARGE_SHARE = 0.5


def queued_jobs(limits: arrays.SiteLimits, user: str, points: int) -> tuple[Optional[int], str]:
    """Jobs counted against the limit that applies (array tasks one by one), and a note
    for stderr when they cannot be known. MaxSubmitJobs: the user's own (one squeue -u).
    MaxJobCount: asked only for a sweep large against it, as one counter (sdiag's pending
    and running jobs), never a listing of every user's jobs; None when not asked or not
    answered."""
    if limits.max_submit_jobs is not None:
        out = commands.query([*arrays.SQUEUE_COUNT_ARGV, "-u", user], timeout=30)
        return (len(out.splitlines()) if out else 0), ""
    if points < LARGE_SHARE * limits.max_job_count:
        return None, ""
    held = live_jobs(commands.query(["sdiag"], timeout=30) or "")
    if held is None:
        return None, (
            f"hpclaunch: note: cannot tell how many of MaxJobCount {limits.max_job_count} "
            f"jobs the cluster holds now (sdiag did not answer): {points} points are "
            "submitted unchecked; sbatch refuses them if the job table is full"
        )
    return held, ""


def live_jobs(sdiag: str) -> Optional[int]:
    """`Jobs pending:` + `Jobs running:` of sdiag's output (array tasks one by one); None
    when either is missing."""
    found: dict[str, int] = {}
    for line in sdiag.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("Jobs pending", "Jobs running") and value.strip().isdigit():
            found.setdefault(key.strip(), int(value.strip()))
    return sum(found.values()) if len(found) == 2 else None
