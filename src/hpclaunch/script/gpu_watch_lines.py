"""The GPU watch in a batch job: whether a run has one, and the script lines that start
and stop it (the sampler itself: node/gpu_watch.py; reading its samples: gpu_metrics.py).

Why it starts the way it does (docs/watching.md says the same for users):

- One `srun --overlap` step, a task per node, not a child of each node's first rank:
  the step runs on the node outside any container (where the node's nvidia-smi or
  rocm-smi is; images rarely carry them), in no rank's CPU binding, and a step gets all
  of the job's GPUs by default, so with ConstrainDevices=yes (the cgroup hides GPUs a
  step does not hold) it still sees every GPU the ranks use; --overlap lets it share
  them and the CPUs instead of waiting for them.
- Off the launch's critical path: it is started one second after the ranks' step (a
  background subshell that sleeps first), so its srun and Python start-up never compete
  with the ranks' for the batch node's CPUs or slurmctld's step-create RPC; nothing
  waits for it.
- It stops with the ranks: SIGUSR1 (srun passes it to the task; SIGTERM would make srun
  kill the step) and a stop file for a watch whose srun had not launched its task yet
  (the watch checks it each second); then the script waits for it, so its last samples
  are written before the job ends. Slurm ends it with the job in any case (scancel, the
  time limit, a node failure).
"""

from __future__ import annotations

import os
from typing import Optional

from hpclaunch import node
from hpclaunch.basics import shell
from hpclaunch.config import topology
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.options import RunOptions
from hpclaunch.config.profiles import Profile
from hpclaunch.errors import UserError, show
from hpclaunch.records.runpaths import RunPaths

DEFAULT_INTERVAL_S = 2.0
INTERVAL_RANGE_S = (0.5, 600.0)  # below: the sampler's own cost; above: nothing to see
START_DELAY_S = 1  # after the ranks' srun started (whole seconds: `sleep` takes them)
# In the run folder (metrics/ may not exist yet); per job, and per --requeue attempt.
STOP_FILE = ".gpu-watch-stop-${SLURM_JOB_ID}"


WINDOW_RANGE_S = (5.0, 86400.0)  # --watch-window: a few samples at least, a day at most
WARMUP_RANGE_S = (0.0, 86400.0)  # --watch-warmup


def window_from_values(options: RunOptions) -> tuple[Optional[float], Optional[float]]:
    """(--watch-window, --watch-warmup) in seconds, checked; None: the watch's default."""
    found: list[Optional[float]] = []
    for flag, given, (low, high) in (
        ("--watch-window", options.watch_window, WINDOW_RANGE_S),
        ("--watch-warmup", options.watch_warmup, WARMUP_RANGE_S),
    ):
        if given is not None and not low <= float(given) <= high:
            raise UserError(
                flag, f"{show(given)} seconds", f"{low:g} to {high:g}", f"Give e.g. {flag} 60"
            )
        found.append(float(given) if given is not None else None)
    return found[0], found[1]


def interval_from_values(
    options: RunOptions, gpus_per_node: int, local: bool, path: str = ""
) -> float:
    """Seconds between samples; 0.0 (no watch) with --no-watch, for a job without GPUs,
    or a local run on a machine whose GPU tools (on `path`) list none."""
    given = options.watch_interval
    if given is not None:
        low, high = INTERVAL_RANGE_S
        if not low <= float(given) <= high:
            raise UserError(
                "--watch-interval",
                f"{show(given)} seconds",
                f"{low:g} to {high:g}",
                "Give e.g. --watch-interval 5, or --no-watch for no GPU samples",
            )
    if options.no_watch:
        return 0.0
    if local and not topology.local_gpus(path or os.defpath):  # a workstation's GPUs count
        return 0.0
    if not local and not gpus_per_node:
        return 0.0
    return float(given) if given is not None else DEFAULT_INTERVAL_S


def watch_argv(spec: JobSpec, profile: Profile, paths: RunPaths) -> list[str]:
    """The watch's step: a task per node beside the ranks, sharing their CPUs and GPUs."""
    metrics = paths.run_dir / node.METRICS
    return [
        "srun", "--overlap", f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1", "--cpus-per-task=1", "--kill-on-bad-exit=0",
        profile.python, *node.PYTHON_FLAGS, str(paths.shipped(node.GPU_WATCH)),
        "--out", str(metrics / (node.GPU_CSV % "{node}")),
        "--interval", f"{spec.watch_interval_s:g}", "--warn",
        "--events", str(paths.run_dir / node.EVENTS), *window_args(spec),
    ]  # fmt: skip


def window_args(spec: JobSpec) -> list[str]:
    """--window/--warmup for the sampler, only where the run gave them (else its own)."""
    given = (("--window", spec.watch_window_s), ("--warmup", spec.watch_warmup_s))
    return [item for flag, value in given if value is not None for item in (flag, f"{value:g}")]


def local_argv(spec: JobSpec, python: str, paths: RunPaths, launcher_pid: int) -> list[str]:
    """A local run's watch: one sampler here, beside the ranks (no srun); it stops on
    SIGUSR1 when they are done, or when hpclaunch (--pid) is gone."""
    metrics = paths.run_dir / node.METRICS
    return [
        python, *node.PYTHON_FLAGS, str(paths.shipped(node.GPU_WATCH)),
        "--out", str(metrics / (node.GPU_CSV % "{node}")),
        "--interval", f"{spec.watch_interval_s:g}", "--warn",
        "--events", str(paths.run_dir / node.EVENTS), *window_args(spec),
        "--pid", str(launcher_pid),
    ]  # fmt: skip


def start_lines(spec: JobSpec, watch: list[str], paths: RunPaths) -> list[str]:
    """After the ranks' step is started in the background: the watch's step, later."""
    attempt = f"-${{{node.HPCLAUNCH_ATTEMPT}}}" if spec.requeue else ""
    stop = shell.Join((str(paths.run_dir) + "/", shell.Template(STOP_FILE + attempt)))
    return [
        "# The GPU watch (--no-watch turns it off): a sampler per node beside the ranks,",
        "# outside any container, started a moment after them so that they never wait",
        "# for it; a warning when GPUs starve; samples in",
        shell.comment(f"  {paths.run_dir / node.METRICS}/"),
        f"HPCLAUNCH_WATCH_STOP={shell.word(stop)}",
        f"{{ sleep {START_DELAY_S}; exec {shell.command(watch)} --stop-file"
        ' "$HPCLAUNCH_WATCH_STOP"; } &',
        "HPCLAUNCH_WATCH_PID=$!",
        "HPCLAUNCH_WATCH_T0=$SECONDS",
    ]


def stop_lines() -> list[str]:
    """After the ranks' step ended: stop the watch and let it write its last samples."""
    return [
        "# The ranks are done: stop the GPU watch (SIGUSR1, which srun passes on; the",
        "# stop file for a watch whose task had not started yet) and wait for it.",
        'if [ -n "${HPCLAUNCH_WATCH_PID-}" ]; then  # (not when the ranks never started)',
        '    : > "$HPCLAUNCH_WATCH_STOP" 2>/dev/null',
        "    # In its first half minute the watch may not catch SIGUSR1 yet (it would die of",
        "    # it: its task's srun and Python took over 5 s to start on a loaded node): the stop",
        "    # file alone then, which it checks from its start each second.",
        '    [ "$((SECONDS - ${HPCLAUNCH_WATCH_T0:-0}))" -lt 30 ] ||',
        '    kill -USR1 "$HPCLAUNCH_WATCH_PID" 2>/dev/null',
        '    wait "$HPCLAUNCH_WATCH_PID"',
        '    rm -f -- "$HPCLAUNCH_WATCH_STOP"',
        "fi",
    ]
