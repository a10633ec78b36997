"""The Slurm batch backend: sbatch to start, one squeue + one sacct per refresh for the
status of any number of jobs, scancel to cancel. Every command goes through slurmcmd.

Sites rate-limit RPCs per user and ban tools that poll in loops, so `status` never asks
per job: squeue answers for every job still queued or running, and one sacct call for
the rest (accounting database, else the job-completion file that sites without a
database keep; which of the two answers is remembered for the process).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

from .. import render, secretnames, slurmcmd, states
from ..errors import SlurmError
from ..monitor import JobStatus
from ..render import BatchPlan
from ..requeue import CHAIN_JOBS
from ..users import with_user
from .base import Backend, Launch
from .requests import DryRun

# hpclaunch resolves these into the script; sbatch must not override the script's lines.
RESOLVED_SBATCH_ENV = ("SBATCH_ACCOUNT", "SBATCH_PARTITION", "SBATCH_RESERVATION")
_SACCT_MODES: tuple[tuple[str, ...], ...] = (("-X",), ("-c",))  # database, completion file


def submission_env(plan: BatchPlan, environ: Mapping[str, str]) -> dict[str, str]:
    return sbatch_env(environ, plan.secret_env)


def sbatch_env(
    environ: Mapping[str, str], secret: Sequence[tuple[str, str]] = ()
) -> dict[str, str]:
    """sbatch's environment: the requester's (USER from the uid where unset) without
    what the script already resolved, plus the secrets that never reach a file."""
    env = {k: v for k, v in with_user(environ).items() if k not in RESOLVED_SBATCH_ENV}
    env.update(dict(secret))
    return env


def submit(
    plan: BatchPlan, environ: Mapping[str, str], argv: Optional[Sequence[str]] = None
) -> str:
    out = slurmcmd.run(list(argv or plan.sbatch_argv), env=submission_env(plan, environ))
    job_id = out.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id: {out.strip()!r}")
    return job_id


def submit_chain(launch: Launch) -> list[str]:
    """--chain K: K jobs of one script, member i after member i-1 ended (any state),
    told its place as $1. A refused member cancels those already queued: all or none."""
    *head, script = launch.plan.sbatch_argv
    ids: list[str] = []
    try:
        for member in range(launch.spec.chain):
            after = [f"--dependency=afterany:{ids[-1]}"] if ids else []
            ids.append(submit(launch.plan, launch.environ, [*head, *after, script, str(member)]))
    except BaseException:
        if ids:
            slurmcmd.query(["scancel", *ids], timeout=30)
        raise
    # The member that finds the program done cancels the rest: it reads them here.
    (launch.paths.run_dir / CHAIN_JOBS).write_text("".join(f"{i}\n" for i in ids))
    return ids


def batch_dry_run(launch: Launch) -> DryRun[BatchPlan]:
    plan, secrets = launch.plan, launch.spec.masked_secrets()
    text = secretnames.mask_text(render.preview(plan, launch.environ), secrets)
    script = secretnames.mask_text(plan.script, secrets)
    return DryRun(plan, text, {"script": script, "sbatch": list(plan.sbatch_argv)})


class SlurmBackend(Backend):
    name = "slurm"
    kind = "job"
    unknown_retries = 3  # a restarting controller must not end a --wait early

    def __init__(self) -> None:
        self._sacct_mode: Optional[tuple[str, ...]] = None
        self._chains: dict[str, list[str]] = {}

    def start(self, launch: Launch) -> str:
        if launch.spec.chain > 1:
            ids = submit_chain(launch)
            self._chains[ids[0]] = ids
            return ids[0]
        return submit(launch.plan, launch.environ)

    def dry_run(self, launch: Launch) -> DryRun[BatchPlan]:
        """The job script and the sbatch line(s), as submitted."""
        return batch_dry_run(launch)

    def record_extra(self, job_id: str) -> dict[str, object]:
        chain = self._chains.get(job_id)
        return {"job_ids": chain} if chain else {}

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        ids = sorted({str(j) for j in job_ids if str(j).strip()})
        if not ids:
            return {}
        found = self._queued(ids)
        rest = [j for j in ids if j not in found]
        if rest:
            found.update(self._accounted(rest))
        rest = [j for j in ids if j not in found]
        if rest:
            found.update(self._controller(rest))
        return found

    def cancel(self, job_id: str) -> None:
        slurmcmd.run(["scancel", job_id])

    def _queued(self, ids: list[str]) -> dict[str, JobStatus]:
        """Jobs squeue still shows in an active state (it forgets jobs soon after)."""
        try:
            out = slurmcmd.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T|%r"], timeout=30)
        except SlurmError:
            return {}  # squeue refuses a list of ids it all forgot: ask accounting
        found: dict[str, JobStatus] = {}
        for line in out.splitlines():
            job, _, rest = line.strip().partition("|")
            state, _, reason = rest.partition("|")
            if job in ids and states.is_active(states.parse(state)):
                found[job] = JobStatus(state, "" if reason == "None" else reason, None)
        return found

    def _accounted(self, ids: list[str]) -> dict[str, JobStatus]:
        """One sacct call for every job that left the queue (the last record wins:
        a requeued job has several)."""
        modes = (self._sacct_mode,) if self._sacct_mode else _SACCT_MODES
        for mode in modes:
            argv = ["sacct", *mode, "-n", "-P", "-j", ",".join(ids), "-o", "JobID,State,ExitCode"]
            try:
                out = slurmcmd.run(argv, timeout=30)
            except SlurmError:
                continue
            self._sacct_mode = mode
            found: dict[str, JobStatus] = {}
            for line in out.splitlines():
                job, _, rest = line.strip().partition("|")
                state, _, code = rest.partition("|")
                if job in ids and state:
                    found[job] = JobStatus(state.split()[0], "", code or None)
            return found
        return {}

    def _controller(self, ids: list[str]) -> dict[str, JobStatus]:
        """Jobs that ended moments ago and accounting has not written yet: slurmctld
        still holds them for MinJobAge (asked per job, only for these few)."""
        found: dict[str, JobStatus] = {}
        for job in ids:
            out = slurmcmd.query(["scontrol", "-o", "show", "job", job], timeout=30)
            fields = _parse_scontrol(out or "")
            if fields.get("JobState"):
                reason = fields.get("Reason", "")
                found[job] = JobStatus(
                    fields["JobState"], "" if reason == "None" else reason, fields.get("ExitCode")
                )
        return found


def _parse_scontrol(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields
