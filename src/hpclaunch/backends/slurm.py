"""The Slurm backend: every sbatch/squeue/scontrol/sacct/scancel/srun call goes through
`_run` here, with argv lists (never a shell) and Slurm's own error text passed on."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from typing import Optional

from ..errors import SlurmError
from ..monitor import JobStatus
from ..render import BatchPlan

# hpclaunch resolves these into the script; sbatch must not override the script's lines.
RESOLVED_SBATCH_ENV = ("SBATCH_ACCOUNT", "SBATCH_PARTITION", "SBATCH_RESERVATION")
ACTIVE = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
}


def _run(argv: list[str], env: Optional[Mapping[str, str]] = None, timeout: float = 60) -> str:
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=dict(env) if env is not None else None,
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]}: not found on PATH (is Slurm installed here?)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]}: no answer after {timeout:.0f} s") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        # Slurm's reason is on its "error:" line; "Try --help" lines after it say nothing.
        errors = [ln for ln in lines if "error" in ln.lower()] or lines
        detail = "; ".join(errors[-2:]) if errors else f"exit {proc.returncode}"
        raise SlurmError(f"{argv[0]} failed: {detail}")
    return proc.stdout


def submission_env(plan: BatchPlan, environ: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if k not in RESOLVED_SBATCH_ENV}
    env.update(dict(plan.secret_env))
    return env


def submit(plan: BatchPlan, environ: Mapping[str, str]) -> str:
    out = _run(list(plan.sbatch_argv), env=submission_env(plan, environ))
    job_id = out.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id: {out.strip()!r}")
    return job_id


class SlurmStatus:
    """JobStatus from squeue while Slurm knows the job, then scontrol, then sacct.

    A job no command knows is asked about again a few times before it is called
    UNKNOWN: a controller that restarts or times out must not end a --wait early.
    """

    def __init__(self, retries: int = 3, retry_wait_s: float = 2.0) -> None:
        self.retries = retries
        self.retry_wait_s = retry_wait_s

    def status(self, job_id: str) -> JobStatus:
        result = self._status(job_id)
        for _ in range(self.retries):
            if result.state != "UNKNOWN":
                break
            time.sleep(self.retry_wait_s)
            result = self._status(job_id)
        return result

    def _status(self, job_id: str) -> JobStatus:
        try:
            out = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], timeout=30).strip()
        except SlurmError:
            out = ""  # squeue refuses ids it forgot ("Invalid job id"): ask the others
        if out:
            state, _, reason = out.splitlines()[0].partition("|")
            if state in ACTIVE:
                return JobStatus(state, "" if reason == "None" else reason, None)
        return self._final(job_id)

    def _final(self, job_id: str) -> JobStatus:
        try:
            fields = _parse_scontrol(_run(["scontrol", "-o", "show", "job", job_id], timeout=30))
            if fields.get("JobState"):
                reason = fields.get("Reason", "")
                return JobStatus(
                    fields["JobState"], "" if reason == "None" else reason, fields.get("ExitCode")
                )
        except SlurmError:
            pass
        for argv in (
            ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"],
            ["sacct", "-c", "-n", "-P", "-j", job_id, "-o", "State,ExitCode"],
        ):
            try:
                lines = [ln for ln in _run(argv, timeout=30).splitlines() if ln.strip()]
            except SlurmError:
                continue
            if lines:
                state, _, code = lines[-1].partition("|")
                return JobStatus(state.split()[0], "", code or None)
        return JobStatus("UNKNOWN", "Slurm no longer knows the job", None)


def _parse_scontrol(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def cancel(job_id: str) -> None:
    _run(["scancel", job_id])


def run_step(argv: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start an srun step inside the current allocation (salloc/sbatch shell)."""
    try:
        return subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise SlurmError(f"srun: {exc.strerror}") from None


__all__ = ["SlurmStatus", "cancel", "run_step", "submission_env", "submit"]
