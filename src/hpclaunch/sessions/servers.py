"""A session's server on the node (Jupyter, sshd) and the relay to it: two overlapping
steps of attach's kind on the session's first node. The server listens on the node's
loopback only, on a random port; the relay step (node/relay.py) connects to it there
and carries its connections over its own stdin/stdout, so nothing of the session
listens on the cluster's network."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

from hpclaunch import node
from hpclaunch.basics import filemodes
from hpclaunch.observe import attach
from hpclaunch.records.runrecord import RunRecord
from hpclaunch.sessions.relay import Relay
from hpclaunch.sessions.shell import has_container, interactive
from hpclaunch.slurm import commands

# Ports a session's server takes on the node: above the usual services and below
# Linux's ephemeral range (32768-60999 by default), whose ports clients take.
PORTS = (20000, 32000)
RELAY_CODE = node.path(node.RELAY).read_text(encoding="utf-8")


def random_port() -> int:
    return PORTS[0] + secrets.randbelow(PORTS[1] - PORTS[0])


def log_file(record: RunRecord, name: str) -> Path:
    """<run>/logs/dev-NAME.log, private like every file of the run."""
    return record.path / node.LOGS / f"dev-{name}.log"


def start_server(
    record: RunRecord,
    command: Sequence[str],
    environ: Mapping[str, str],
    secret_env: Mapping[str, str],
    log: Path,
    container: Optional[bool] = None,
) -> subprocess.Popen[bytes]:
    """The server as a step on the first node, inside the run's container when it has
    one (its venv, variables, binds), its output into `log`; secret_env reaches it as
    variables, never on a command line."""
    target = attach.find_target(record, None)
    plan = attach.plan_attach(
        record,
        target,
        interactive(command),
        container=has_container(record) if container is None else container,
        pty=False,
        environ=environ,
        add_env=secret_env,
    )
    share = filemodes.share_of(record.path)
    fd = filemodes.open_new(log, os.O_WRONLY | os.O_TRUNC, share)
    with os.fdopen(fd, "wb") as out:
        return commands.start(plan.argv, plan.env, output=out, own_session=True)


def relay_argv(record: RunRecord, port: int, environ: Mapping[str, str]) -> attach.Plan:
    """The relay's step: the node's own python3 (outside any image: the image shares
    the node's loopback), the relay's text handed to it."""
    target = attach.find_target(record, None)
    command = ["python3", *node.PYTHON_FLAGS, "-c", RELAY_CODE, str(port)]
    return attach.plan_attach(record, target, command, container=False, pty=False, environ=environ)


def start_relay(
    record: RunRecord, port: int, environ: Mapping[str, str], local_port: int = 0
) -> Relay:
    """The relay's near end here; srun's own words into <run>/logs/dev-relay.log."""
    plan = relay_argv(record, port, environ)
    log = log_file(record, "relay")
    fd = filemodes.open_new(log, os.O_WRONLY | os.O_TRUNC, filemodes.share_of(record.path))
    with os.fdopen(fd, "wb") as err:
        return Relay(plan.argv, plan.env, port=local_port, stderr=err)


def stop(
    proc: Optional[subprocess.Popen[bytes]],
    grace_s: float = 10.0,
    first: signal.Signals = signal.SIGTERM,
) -> None:
    """srun passes SIGTERM on to the step's tasks (the server shuts down, its kernels
    too); SIGKILL for an srun that does not go. first=SIGUSR1 for a task that must clean
    up after itself (the --vscode sshd's keeper): srun forwards SIGUSR1 to the tasks as
    it is, while its own SIGTERM makes it abort the step ("srun: forcing job
    termination"), whose tasks were then killed before they could (seen on the testbed);
    SIGTERM follows if the step has not ended after grace_s."""
    if proc is None or proc.poll() is not None:
        return
    signals = [first] if first == signal.SIGTERM else [first, signal.SIGTERM]
    for signum in signals:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)
        try:
            proc.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.kill()
    proc.wait()
