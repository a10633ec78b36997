"""The Slurm batch backend: sbatch to start, one squeue + one sacct per refresh for the
status of any number of jobs, scancel to cancel. Every command goes through slurm/commands.py.

Sites rate-limit RPCs per user and ban tools that poll in loops, so `status` never asks
per job: squeue answers for every job still queued or running, and one sacct call for
the rest (accounting database, else the job-completion file that sites without a
database keep; which of the two answers is remembered for the process).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Optional

from hpclaunch.backends.base import ArrayLaunch, Backend, Launch
from hpclaunch.backends.requests import DryRun
from hpclaunch.basics import states
from hpclaunch.basics.users import with_user
from hpclaunch.config import secretnames
from hpclaunch.errors import SlurmError
from hpclaunch.observe.jobend import JobStatus
from hpclaunch.records.runrecord import RunRecord
from hpclaunch.script import render
from hpclaunch.script.render import BatchPlan
from hpclaunch.script.requeue import CHAIN_JOBS
from hpclaunch.slurm import commands, refusals
from hpclaunch.slurm.arraytasks import SACCT_FIELDS, SQUEUE_ARGV, TaskKey, parse_sacct, parse_squeue

# hpclaunch resolves these into the script; sbatch must not override the script's lines.
RESOLVED_SBATCH_ENV = ("SBATCH_ACCOUNT", "SBATCH_PARTITION", "SBATCH_RESERVATION")
_SACCT_MODES = ("-X", "-c")  # the accounting database, the job completion file


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
    return submit_argv(list(argv or plan.sbatch_argv), submission_env(plan, environ))


def submit_argv(argv: list[str], env: dict[str, str]) -> str:
    try:
        out = commands.run(argv, env=env)
    except SlurmError as exc:  # a site's rejection is the user's to fix: its words, exit 2
        raise refusals.refusal(exc) from None
    job_id = out.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id: {out.strip()!r}")
    return job_id


def array_argv(job_sh: Path, array: str, offset: int) -> list[str]:
    """One part of a sweep: its tasks run the points offset + SLURM_ARRAY_TASK_ID."""
    return ["sbatch", "--parsable", f"--array={array}", str(job_sh), str(offset)]


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
            commands.query(["scancel", *ids], timeout=30)
        raise
    # The member that finds the program done cancels the rest: it reads them here.
    (launch.paths.run_dir / CHAIN_JOBS).write_text("".join(f"{i}\n" for i in ids))
    return ids


def batch_dry_run(launch: Launch) -> DryRun[BatchPlan]:
    plan, secrets = launch.plan, launch.spec.masked_secrets()
    text = secretnames.mask_text(render.preview(plan, launch.environ), secrets)
    script = secretnames.mask_text(plan.script, secrets)
    return DryRun(plan, text, {"script": script, "sbatch": list(plan.sbatch_argv)})


class _Memory:
    """What Slurm taught this process, shared by every SlurmBackend in it: which sacct
    answers at this site (the accounting database, else the job completion file) and
    the own job id of each array task seen (sacct -c knows a task only by that)."""

    sacct_mode: ClassVar[Optional[str]] = None
    own_ids: ClassVar[dict[str, str]] = {}


def site_sacct_mode() -> Optional[str]:
    """Which sacct answers here, from the (cached) `scontrol show config`: the job
    completion file (-c) where there is no accounting database, else the database (-X)."""
    from hpclaunch.slurm import discover

    config = discover.slurm_config()
    if not config or "AccountingStorageType" not in config:
        return None
    return "-c" if config["AccountingStorageType"].endswith("/none") else "-X"


class SlurmBackend(Backend):
    name = "slurm"
    kind = "job"
    unknown_retries = 3  # a restarting controller must not end a --wait early

    def __init__(self) -> None:
        self._chains: dict[str, list[str]] = {}
        self._calls: list[str] = []
        self._records: dict[str, RunRecord] = {}  # array task -> its record (learn)

    def start(self, launch: Launch) -> str:
        if launch.spec.chain > 1:
            ids = submit_chain(launch)
            self._chains[ids[0]] = ids
            return ids[0]
        return submit(launch.plan, launch.environ)

    def dry_run(self, launch: Launch) -> DryRun[BatchPlan]:
        """The job script and the sbatch line(s), as submitted."""
        return batch_dry_run(launch)

    def start_array(self, launch: ArrayLaunch) -> list[str]:
        """One sbatch per part (a first submission or a retry); a part Slurm refuses
        cancels the parts already queued: all or none."""
        env = sbatch_env(launch.environ, launch.secret_env)
        job_ids: list[str] = []
        try:
            for part in launch.parts:
                job_ids.append(submit_argv(array_argv(launch.job_sh, part.array, part.offset), env))
        except BaseException:
            if job_ids:
                commands.query(["scancel", *job_ids])
            raise
        return job_ids

    def record_extra(self, job_id: str) -> dict[str, object]:
        """A chain's members (started here); an array task's own job id (learnt)."""
        chain = self._chains.get(job_id)
        if chain:
            return {"job_ids": chain}
        own = _Memory.own_ids.get(job_id)
        return {"slurm_job_id": own} if own and own != job_id.partition("_")[0] else {}

    def site_facts(self) -> dict[str, object]:
        mode = _Memory.sacct_mode or site_sacct_mode()
        return {"sacct_mode": mode} if mode else {}

    def learn(self, record: RunRecord) -> None:
        mode = record.extra.get("sacct_mode")
        if _Memory.sacct_mode is None and mode in _SACCT_MODES:
            _Memory.sacct_mode = str(mode)
        job = str(record.job_id or "")
        if "_" in job:  # its own job id is looked up only if squeue no longer lists it
            self._records[job] = record

    def _own_id(self, task: str) -> str:
        """An array task's own job id: seen by this process, kept in its record, or noted
        by its point when it started; "" when it never started (or is unknown)."""
        own = _Memory.own_ids.get(task)
        if own is None and task in self._records:
            record = self._records[task]
            own = str(record.extra.get("slurm_job_id") or own_start_id(record.path, task))
            if own:
                _Memory.own_ids[task] = own
        return own or ""

    def commands_run(self) -> list[str]:
        return list(self._calls)

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """Plain jobs ("123") and array tasks ("123_4") alike: one squeue -r, at most one
        sacct for what it no longer lists, scontrol for plain jobs neither knows yet."""
        ids = sorted({str(j) for j in job_ids if str(j).strip()})
        if not ids:
            return {}
        found = self._queued(ids)
        rest = [j for j in ids if j not in found]
        if rest:
            found.update(self._accounted(rest))
        rest = [j for j in ids if j not in found]
        if rest:
            found.update(self._cancelled_while_pending(rest, found))
            found.update(self._controller([j for j in rest if "_" not in j and j not in found]))
        return found

    def cancel(self, job_id: str) -> None:
        commands.run(["scancel", job_id])

    def cancel_many(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            commands.run(["scancel", *job_ids])

    def throttle(self, job_id: str, parallel: int) -> None:
        commands.run(["scontrol", "update", f"JobId={job_id}", f"ArrayTaskThrottle={parallel}"])

    def _queued(self, ids: list[str]) -> dict[str, JobStatus]:
        """squeue -r: plain jobs still active; array tasks in any state it still lists
        (a task that ended gets its exit code from its own end event)."""
        asked = sorted({j.partition("_")[0] for j in ids}, key=_numeric)
        self._calls.append("squeue")
        try:
            out = commands.run([*SQUEUE_ARGV, "-j", ",".join(asked)], timeout=30)
        except SlurmError:
            return {}  # squeue refuses a list of ids it all forgot: ask accounting
        wanted = set(ids)
        found: dict[str, JobStatus] = {}
        for (array_id, task), row in parse_squeue(out).items():
            key = f"{array_id}_{task}"
            if row.job_id:
                _Memory.own_ids[key] = row.job_id
            if key in wanted:
                found[key] = JobStatus(row.state, row.reason, None)
        for job, state, reason in parse_plain_squeue(out):
            if job in wanted and states.is_active(states.parse(state)):
                found[job] = JobStatus(state, reason, None)
        return found

    def _accounted(self, ids: list[str]) -> dict[str, JobStatus]:
        """One sacct call in the mode the site answers (the other only when that one
        fails); the last record wins: a requeued job has several."""
        tasks = [j for j in ids if "_" in j]
        # sacct -c knows a task only by its own job id, a never-started one by its array's.
        known: dict[str, list[TaskKey]] = {}
        for task in tasks:
            array_id, _, index = task.partition("_")
            own = self._own_id(task) or array_id
            known.setdefault(own, []).append((array_id, int(index) if index.isdigit() else -1))
        asked = {j.partition("_")[0] for j in ids} | set(known)
        mode = _Memory.sacct_mode
        for each in [m for m in _SACCT_MODES if m == mode] + [m for m in _SACCT_MODES if m != mode]:
            argv = ["sacct", each, "-n", "-P", "-j", ",".join(sorted(asked, key=_numeric))]
            self._calls.append("sacct")
            try:
                out = commands.run([*argv, "-o", SACCT_FIELDS], timeout=30)
            except SlurmError:
                continue
            _Memory.sacct_mode = each
            return _sacct_answers(out, ids, known)
        return {}

    def _cancelled_while_pending(
        self, rest: Sequence[str], found: Mapping[str, JobStatus]
    ) -> dict[str, JobStatus]:
        """scancel of one pending task takes it out of its array's record: no job record,
        no accounting line is left, while its siblings are still listed."""
        listed = {j.partition("_")[0] for j in found if "_" in j}
        out: dict[str, JobStatus] = {}
        for task in rest:
            if "_" in task and task.partition("_")[0] in listed and not self._own_id(task):
                out[task] = JobStatus(states.State.CANCELLED.value, "cancelled while pending", None)
        return out

    def _controller(self, ids: list[str]) -> dict[str, JobStatus]:
        """Jobs that ended moments ago and accounting has not written yet: slurmctld
        still holds them for MinJobAge (asked per job, only for these few)."""
        found: dict[str, JobStatus] = {}
        for job in ids:
            self._calls.append("scontrol")
            out = commands.query(["scontrol", "-o", "show", "job", job], timeout=30)
            fields = _parse_scontrol(out or "")
            if fields.get("JobState"):
                reason = fields.get("Reason", "")
                found[job] = JobStatus(
                    fields["JobState"], "" if reason == "None" else reason, fields.get("ExitCode")
                )
        return found


def _sacct_answers(
    out: str, ids: Sequence[str], known: dict[str, list[TaskKey]]
) -> dict[str, JobStatus]:
    wanted = set(ids)
    found: dict[str, JobStatus] = {}
    for (array_id, task), row in parse_sacct(out, known).items():
        key = f"{array_id}_{task}"
        if row.job_id and row.job_id != array_id:
            _Memory.own_ids.setdefault(key, row.job_id)
        if key in wanted:
            code = None if row.exit_code is None else f"{row.exit_code}:0"
            found[key] = JobStatus(row.state, "", code)
    for line in out.splitlines():
        job, _, rest = line.strip().partition("|")
        _, _, rest = rest.partition("|")
        state, _, code = rest.partition("|")
        if job in wanted and "_" not in job and state and job not in known:
            found[job] = JobStatus(state.split()[0], "", code or None)
    return found


def parse_plain_squeue(text: str) -> list[tuple[str, str, str]]:
    """(job id, state, reason) of the jobs that are no array task in SQUEUE_ARGV's output."""
    rows = []
    for line in text.splitlines():
        fields = line.strip().split("|", 4)
        if len(fields) == 5 and fields[1] == "N/A":
            rows.append((fields[2], fields[3], "" if fields[4] == "None" else fields[4]))
    return rows


def own_start_id(run_dir: Path, job: str) -> str:
    """An array task's own job id, as its point noted when it started (point_start)."""
    from hpclaunch.records.runrecord import job_event

    start = job_event(run_dir, "point_start", job)
    return str(start.get("job_id") or "") if start else ""


def _numeric(text: str) -> tuple[int, str]:
    return (int(text), "") if text.isdigit() else (0, text)


def _parse_scontrol(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields
