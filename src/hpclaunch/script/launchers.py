"""What each Slurm task runs: the bootstrap directly (srun launcher, one task per rank)
or one torchrun agent per node whose workers are bootstraps (torchrun launcher).

Both return argv as shell Words: variables that only exist in the job (MASTER_ADDR,
SLURM_JOB_ID, ...) stay references, expanded by the batch shell or, for the local
backend, by shell.expand with the values the local backend chose.
"""

from __future__ import annotations

import functools
import os

from hpclaunch.basics.shell import Template, Var, Word
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.node import (
    ENV_FD_FLAG,
    EXEC_FLAG,
    HPCLAUNCH_ARGV,
    HPCLAUNCH_FORWARD_SIGNALS,
    HPCLAUNCH_NODE_LOGS,
    PYTHON_FLAGS,
)


def bootstrap_argv(python: str, bootstrap: str, program: tuple[str, ...]) -> list[Word]:
    return [python, *PYTHON_FLAGS, bootstrap, *program]


def via_environment(program: tuple[str, ...]) -> bool:
    """srun cuts its command line at an argument that is exactly ":" (heterogeneous
    steps); such a program line reaches the bootstrap through HPCLAUNCH_ARGV instead."""
    return ":" in program


def encode_argv(program: tuple[str, ...]) -> str:
    return ",".join(_hex_word(arg) for arg in program)


@functools.lru_cache(maxsize=4096)
def _hex_word(arg: str) -> str:
    """One word as hex, once: a sweep's points repeat theirs (a 1,000-point grid encoded
    4,000 words, os.fsencode a third of its params.sh)."""
    return os.fsencode(arg).hex()


def task_argv(spec: JobSpec, python: str, bootstrap: str, env_fd: int = 0) -> list[Word]:
    """With env_fd (a container), the first Python in the task reads the environment
    from that descriptor: the rank's bootstrap under srun, an exec-only bootstrap in
    front of the torchrun agent (whose workers inherit what it set)."""
    program = () if via_environment(spec.program) else spec.program
    inner = bootstrap_argv(python, bootstrap, program)
    enter: list[Word] = [python, *PYTHON_FLAGS, bootstrap, f"{ENV_FD_FLAG}{env_fd}"]
    if spec.launcher == "srun":
        return [*enter, *program] if env_fd else inner
    head: list[Word] = ["torchrun"]
    if spec.nodes == 1:
        head += ["--standalone", "--nnodes=1"]
    else:
        head += [
            Template("--nnodes=${SLURM_NNODES}"),
            f"--nproc-per-node={spec.tasks_per_node}",
            "--rdzv-backend=c10d",
            Template("--rdzv-endpoint=${MASTER_ADDR}:${MASTER_PORT}"),
            Template("--rdzv-id=${SLURM_JOB_ID}"),
        ]
    if spec.nodes == 1:
        head.append(f"--nproc-per-node={spec.tasks_per_node}")
    agent = [*head, "--no-python", *inner]
    if env_fd or spec.requeue:
        # An exec-only bootstrap in front: it hands over the container's environment,
        # and under --requeue it makes the agent ignore the requeue signal (srun passes
        # it to every process of the task; the agent would die of it, its workers too).
        return [*(enter if env_fd else bootstrap_argv(python, bootstrap, ())), EXEC_FLAG, *agent]
    return agent


def launcher_env(spec: JobSpec) -> dict[str, str]:
    """Variables the bootstrap reads to know how it was started."""
    env: dict[str, str] = {"HPCLAUNCH_LAUNCHER": spec.launcher}
    if spec.node_logs:  # above the profile's node_logs_above ranks: a log file a node
        env[HPCLAUNCH_NODE_LOGS] = "1"
    if via_environment(spec.program):
        env[HPCLAUNCH_ARGV] = encode_argv(spec.program)
    if spec.launcher == "torchrun":
        # torchrun signals only its direct child (the bootstrap), which must pass it on.
        env[HPCLAUNCH_FORWARD_SIGNALS] = "1"
    elif spec.container is not None and spec.container.runtime == "podman-hpc":
        # The ranks run under podman's conmon, outside Slurm's step: Slurm signals only
        # `podman run`, which passes it to the bootstrap alone (podman-run(1) --sig-proxy).
        env[HPCLAUNCH_FORWARD_SIGNALS] = "always"
    return env


__all__ = ["Var", "bootstrap_argv", "launcher_env", "task_argv"]
