"""The one runner of Slurm commands (sbatch, squeue, sacct, scontrol, scancel, sinfo).

Every Slurm call hpclaunch makes goes through `run` (an error is a SlurmError carrying
Slurm's own reason) or `query` (None when the command is missing or fails: for
questions whose absence has a meaning, such as "is there a controller"). Argument lists
only, never a shell. Keeping one runner means one place to add a transport (a login node
over SSH) and one place that counts what hpclaunch asks of slurmctld.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import IO, NoReturn, Optional

from hpclaunch.errors import SlurmError

DEFAULT_TIMEOUT_S = 60.0


def run(
    argv: Sequence[str],
    env: Optional[Mapping[str, str]] = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> str:
    """stdout of a Slurm command, or SlurmError naming the command and Slurm's reason."""
    try:
        proc = subprocess.run(
            list(argv),
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
        raise SlurmError(f"{argv[0]} failed: {reason(proc.stderr or proc.stdout, proc.returncode)}")
    return proc.stdout


def reason(text: str, returncode: int) -> str:
    """Slurm's reason is on its "error:" line; "Try --help" lines after it say nothing."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()] or lines
    return "; ".join(errors[-2:]) if errors else f"exit {returncode}"


def query(argv: Sequence[str], timeout: float = 15.0) -> Optional[str]:
    """stdout of a Slurm query, or None when the command is missing, slow or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        return run(argv, timeout=timeout)
    except SlurmError:
        return None


def start(
    argv: Sequence[str],
    env: Mapping[str, str],
    output: Optional[IO[bytes]] = None,
    own_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start a long-running Slurm command (an srun step) without waiting for it; its
    output into `output` when given; in a session of its own when the caller ends it
    itself (a terminal's Ctrl-C then reaches only the caller: hpclaunch dev's servers)."""
    try:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=own_session,
        )
    except OSError as exc:
        raise SlurmError(f"{argv[0]}: {exc.strerror}") from None


def become(argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """Replace this process with a Slurm command (an interactive srun step): the terminal
    (job control, Ctrl-C, the window size) belongs to it and its exit status is ours."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], list(argv), dict(env))
    except OSError as exc:
        raise SlurmError(f"{argv[0]}: {exc.strerror} (is Slurm installed here?)") from None


def attached(
    argv: Sequence[str], env: Mapping[str, str], capture: bool = False
) -> tuple[int, str, str]:
    """A Slurm command as a child with our stdin (and stdout/stderr unless captured):
    (exit code, stdout, stderr). On Ctrl-C or SIGTERM it gets SIGTERM, which ends an
    srun step, instead of being killed and leaving the step behind."""
    pipe = subprocess.PIPE if capture else None
    try:
        proc = subprocess.Popen(list(argv), env=dict(env), stdout=pipe, stderr=pipe)
    except OSError as exc:
        raise SlurmError(f"{argv[0]}: {exc.strerror} (is Slurm installed here?)") from None
    try:
        out, err = proc.communicate()
    except BaseException:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    code = proc.returncode
    text = (out or b"").decode("utf-8", "replace"), (err or b"").decode("utf-8", "replace")
    return (128 - code if code < 0 else code), text[0], text[1]
