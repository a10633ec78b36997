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

from hpclaunch import node
from hpclaunch.basics import shell
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


def interval_from_values(options: RunOptions, gpus_per_node: int, local: bool) -> float:
    """Seconds between samples; 0.0 (no watch) for a job without GPUs, with --no-watch,
    or a local run (not yet: docs/watching.md)."""
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
    if options.no_watch or not gpus_per_node or local:
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
        "--events", str(paths.run_dir / node.EVENTS),
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
    ]


def stop_lines() -> list[str]:
    """After the ranks' step ended: stop the watch and let it write its last samples."""
    return [
        "# The ranks are done: stop the GPU watch (SIGUSR1, which srun passes on; the",
        "# stop file for a watch whose task had not started yet) and wait for it.",
        'if [ -n "${HPCLAUNCH_WATCH_PID-}" ]; then  # (not when the ranks never started)',
        '    : > "$HPCLAUNCH_WATCH_STOP" 2>/dev/null',
        '    kill -USR1 "$HPCLAUNCH_WATCH_PID" 2>/dev/null',
        '    wait "$HPCLAUNCH_WATCH_PID"',
        '    rm -f -- "$HPCLAUNCH_WATCH_STOP"',
        "fi",
    ]
