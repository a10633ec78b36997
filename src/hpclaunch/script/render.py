"""plan(spec, profile, paths) -> BatchPlan: the batch script, the sbatch command and the
environment sbatch runs with. Pure: no I/O, so --dry-run prints exactly what would run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpclaunch import node
from hpclaunch.basics import shell
from hpclaunch.basics.shell import Join, Template, Var, Word
from hpclaunch.basics.units import format_memory, format_time
from hpclaunch.config.jobspec import MASK, JobSpec, StageItem, is_secret
from hpclaunch.config.options import sbatch_line
from hpclaunch.config.profiles import Profile
from hpclaunch.payload import containers, stagepack
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import (
    badnodes,
    broadcast,
    containerlines,
    gpu_watch_lines,
    lostnodes,
    profiling,
    requeue,
    scriptend,
    tasklines,
    venvmount,
)
from hpclaunch.script.containerlines import container_comment as container_comment
from hpclaunch.script.defaultnotes import default_notes
from hpclaunch.script.launchers import launcher_env, task_argv


@dataclass(frozen=True)
class BatchPlan:
    script: str
    sbatch_argv: tuple[str, ...]
    # Variables given to sbatch's environment only (secrets): Slurm passes them to the
    # job; they never appear in the script or on a command line.
    secret_env: tuple[tuple[str, str], ...]
    task_argv: tuple[Word, ...]
    task_env: tuple[tuple[str, Word], ...]  # exported before the launch (also for local)
    srun_argv: tuple[Word, ...]
    chain: int = 1  # --chain K: sbatch_argv is submitted K times (member number as $1)
    # The GPU watch's step (gpu_watch_lines.py; empty without one): the batch script, or a
    # backend running the ranks as a step of an allocation, starts it.
    watch_argv: tuple[str, ...] = ()
    # Files the job reads beside the shipped ones (name, text): the CE's EDF.
    files: tuple[tuple[str, str], ...] = ()


def directives(spec: JobSpec, paths: RunPaths, cwd: Path) -> list[str]:
    spellings = dict(spec.sbatch_spellings)  # the site's own #SBATCH spellings
    lines = [
        shell.sbatch_line("--job-name", spec.job_name),
        shell.sbatch_line("--nodes", str(spec.nodes + spec.spares)),  # --spares: N more
        *tasklines.job_lines(spec),
        shell.sbatch_line("--cpus-per-task", str(_slurm_cpus(spec))),
    ]
    if spec.gpus_per_node:
        lines.append(spec.gpu_request_line())
    if spec.mem_mb is not None:
        lines.append(shell.sbatch_line("--mem", format_memory(spec.mem_mb)))
    if spec.mem_per_gpu_mb is not None:
        lines.append(shell.sbatch_line("--mem-per-gpu", format_memory(spec.mem_per_gpu_mb)))
    if spec.time_s is not None:
        lines.append(shell.sbatch_line("--time", format_time(spec.time_s)))
    for option, value in (("--partition", spec.partition), ("--account", spec.account)):
        if value:
            lines.append(shell.sbatch_line(option, value))
    # The plain Slurm flags, in the registry's order, as the site spells them.
    lines += [sbatch_line(name, value, spellings) for name, value in spec.slurm_flags]
    if spec.exclusive:
        lines.append(shell.sbatch_line("--exclusive"))
    lines += [
        # sbatch expands %j, %x, ... in file names; %% is a literal % (a run root may hold one).
        shell.sbatch_line("--output", str(paths.logs / "batch.out").replace("%", "%%")),
        shell.sbatch_line("--open-mode", "append"),
        shell.sbatch_line("--chdir", str(cwd)),
    ]
    if spec.requeue:
        lines += requeue.directives(spec.requeue)
    else:
        # Slurm's default (JobRequeue=1) requeues a batch job after a node failure: a run
        # without --requeue would start again from scratch, into the same logs.
        lines.append(shell.sbatch_line("--no-requeue"))
    if spec.dependency:
        lines.append(shell.sbatch_line("--dependency", spec.dependency))
    if spec.dependency or spec.chain > 1:
        # A dependency that can never be met ends the job instead of leaving it PENDING.
        lines.append(shell.sbatch_line("--kill-on-invalid-dep", "yes"))
    lines += [shell.sbatch_line(arg) for arg in spec.sbatch_args] + badnodes.directives(spec)
    return lines


def _slurm_cpus(spec: JobSpec) -> int:
    # A torchrun agent is one Slurm task that hosts all the node's ranks.
    return spec.cpus_per_task * (spec.tasks_per_node if spec.launcher == "torchrun" else 1)


def task_env(spec: JobSpec, profile: Profile, paths: RunPaths) -> list[tuple[str, Word]]:
    """Everything every task needs, in export order (later entries win)."""
    # A requeued run's ranks write logs/attempt-N/ (the shell sets HPCLAUNCH_ATTEMPT).
    attempts = bool(spec.requeue or spec.chain > 1)
    logs: Word = requeue.log_dir(paths.logs) if attempts else str(paths.logs)
    env: list[tuple[str, Word]] = [
        (node.HPCLAUNCH_RUN_DIR, str(paths.run_dir)),
        ("HPCLAUNCH_CHECKPOINT_DIR", str(paths.checkpoint_dir)),
        (node.HPCLAUNCH_LOG_DIR, logs),
        ("HPCLAUNCH_RUN_ID", paths.run_id),
        ("HPCLAUNCH_PROJECT", spec.project),
        ("HPCLAUNCH_EXP", spec.exp),
        (node.HPCLAUNCH_GPU_VISIBILITY, spec.gpu_visibility),
        ("PYTHONUNBUFFERED", "1"),
        # ~/.local packages shadow a container's or a venv's (and are bound into images).
        ("PYTHONNOUSERSITE", "1"),
    ]
    if spec.venv:
        env.append((node.HPCLAUNCH_VENV, spec.venv))
    if attempts:
        env += requeue.env(spec.requeue, paths.checkpoint_dir)
        if spec.stage or spec.stage_out:
            marks = requeue.log_dir(paths.run_dir / node.STAGE_MARKS)
            env.append((node.HPCLAUNCH_STAGE_MARKS, marks))
    env += sorted(launcher_env(spec).items())
    if spec.gpu_visibility == "per-task":
        env.append((node.HPCLAUNCH_GPU_VARS, ",".join(profile.gpu_vars)))
        if profile.gpu_unset:
            env.append((node.HPCLAUNCH_GPU_UNSET, ",".join(profile.gpu_unset)))
    if profile.cache_dirs:
        env.append((node.HPCLAUNCH_CACHE_DIRS, Template(":".join(profile.cache_dirs))))
    # A profile's secrets are in spec.env (validate._env): sbatch's environment only.
    env += [(k, Template(v)) for k, v in profile.env.items() if not is_secret(k)]
    if spec.nccl_debug:
        env += [(k, Template(v)) for k, v in profile.debug_env.items()]
    env += profiling.task_env(spec, profile, paths)
    env += [(k, v) for k, v in spec.public_env()]
    env += data_env(spec)
    if spec.container:
        names = containerlines.names(spec, profile, env)
        env.append((node.HPCLAUNCH_CONTAINER_PASS, containers.pass_list(spec.container, names)))
    return env


def data_env(spec: JobSpec) -> list[tuple[str, Word]]:
    """HPCLAUNCH_DATA_<NAME> for every staged item, HPCLAUNCH_DATA when there is one."""
    env: list[tuple[str, Word]] = []
    for item in spec.stage:
        if containers.mounts_image(spec.container, item):
            value: Word = f"{containers.STAGED_IMAGES}/{item.name}"
        else:
            tail = f"/data/{item.name}" + (f"/{item.file}" if item.file else "")
            value = Join((Var(node.HPCLAUNCH_LOCAL), tail))
        env.append((f"HPCLAUNCH_DATA_{item.name}", value))
    if len(spec.stage) == 1:
        env.append(("HPCLAUNCH_DATA", env[0][1]))
    return env


def _stage_note(spec: JobSpec, item: StageItem) -> str:
    size = f"{item.size / 2**20:.1f} MiB"
    if item.kind == node.DIRECTORY:
        return f"${{HPCLAUNCH_DATA_{item.name}}}: {item.src} ({size}), packed as {item.archive}"
    mounted = containers.mounts_image(spec.container, item)
    how = "mounted by the container" if mounted else "unpacked on each node"
    return f"${{HPCLAUNCH_DATA_{item.name}}}: {item.src} ({item.kind}, {size}), {how}"


def stage_json(spec: JobSpec, paths: RunPaths) -> dict[str, object]:
    """What the stage guard does on every node (no secrets: paths and names only)."""
    return {
        "run_dir": str(paths.run_dir),
        "nodes": spec.nodes,
        "items": [
            {
                "name": i.name,
                "kind": i.kind,
                "archive": i.archive,
                "file": i.file,
                "bound": containers.mounts_image(spec.container, i),
                # A pack's parts as written (the guard checks them): [] until packed.
                "parts": stagepack.part_facts(i.archive) if i.kind == node.DIRECTORY else [],
            }
            for i in spec.stage
        ],
        "stage_out": [list(pair) for pair in spec.stage_out],
    }


def stage_lines(
    spec: JobSpec, profile: Profile, paths: RunPaths, own_marks: bool = False
) -> list[str]:
    """The staging guard: one task per node, beside the ranks (--overlap), that unpacks
    before they start and, on their end, scancel or the time limit (Slurm sends every
    step SIGTERM), copies --stage-out results back and removes $HPCLAUNCH_LOCAL.
    `own_marks`: the markers in $HPCLAUNCH_STAGE_MARKS, which the script set."""
    guard = [
        # --ntasks too: srun would take the job's SLURM_NTASKS and start a guard per rank.
        "srun", "--overlap", f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1",
        # Every CPU the job has on the node: the ranks wait for the unpack, which runs
        # one tar per CPU; afterwards the guard only sleeps (--overlap shares them).
        f"--cpus-per-task={_slurm_cpus(spec) * (spec.ntasks // spec.nodes)}",
        "--kill-on-bad-exit=0",
        profile.python, *node.PYTHON_FLAGS,
        str(paths.shipped(node.STAGE_GUARD)), "run",
        str(paths.run_dir / node.STAGE_JSON),
    ]  # fmt: skip
    marks = (
        f'"${node.HPCLAUNCH_STAGE_MARKS}"'
        if spec.requeue or spec.chain > 1 or own_marks
        else shell.quote(str(paths.run_dir / node.STAGE_MARKS))
    )
    return [
        "",
        "# --stage/--stage-out: a guard task per node unpacks into the node-local folder",
        "# before any rank starts, stays beside the ranks, and when they end (or on scancel",
        "# or the time limit, when Slurm sends every step SIGTERM) copies the --stage-out",
        "# results back and removes the folder.",
        *(shell.comment(_stage_note(spec, item)) for item in spec.stage),
        *(shell.comment(f"--stage-out {src} -> {dest}") for src, dest in spec.stage_out),
        shell.command(guard) + " &",
        "HPCLAUNCH_STAGE_PID=$!",
        "shopt -s nullglob",
        "while :; do  # until every node is ready; bash builtins but sleep",
        f"    ready=({marks}/{node.READY}*) failed=({marks}/{node.FAILED}*)",
        '    if (( ${#failed[@]} )) || ! kill -0 "$HPCLAUNCH_STAGE_PID" 2>/dev/null; then',
        '        echo "hpclaunch: staging failed; the ranks are not started" >&2',
        '        kill -USR1 "$HPCLAUNCH_STAGE_PID" 2>/dev/null; wait "$HPCLAUNCH_STAGE_PID"',
        "        exit 1",
        "    fi",
        f"    (( ${{#ready[@]}} >= {spec.nodes} )) && break",
        "    sleep 0.1",
        "done",
        "shopt -u nullglob",
    ]


def uses_local(spec: JobSpec, env: list[tuple[str, Word]]) -> bool:
    """Whether the job has a node-local folder: it stages, or a variable names it."""

    def names_it(word: Word) -> bool:
        if isinstance(word, Var):
            return word.name == node.HPCLAUNCH_LOCAL
        if isinstance(word, Template):
            return node.HPCLAUNCH_LOCAL in word.text
        if isinstance(word, Join):
            return any(names_it(part) for part in word.parts)
        return False

    return bool(spec.stage or spec.stage_out) or any(names_it(word) for _, word in env)


def local_lines(profile: Profile, paths: RunPaths) -> list[str]:
    """$HPCLAUNCH_LOCAL's setting: each node's first step (the stage guard, else the
    bootstrap of local rank 0) makes the folder fresh under the parent, private, with a
    name nobody can guess, and records it in <run>/nodelocal; the bootstrap puts it in
    place of LOCAL_UNSET in every variable, so nothing here names a path in /tmp."""
    return [
        "# The job's node-local folder: made fresh on each node (mode 700, an unpredictable",
        "# name) under the profile's local_dir; the ranks learn its path on their node.",
        f"{node.HPCLAUNCH_LOCAL_PARENT}={profile.local_dir}",
        f"export {node.HPCLAUNCH_LOCAL_PARENT}",
        shell.export(node.HPCLAUNCH_LOCAL_RECORD, str(paths.run_dir / node.LOCAL_RECORDS)),
        shell.export(node.HPCLAUNCH_LOCAL, node.LOCAL_UNSET),
    ]


def srun_argv(spec: JobSpec, argv: list[Word], flags: Sequence[Word] = ()) -> list[Word]:
    head: list[Word] = [
        "srun",
        "--kill-on-bad-exit=1",
        "--distribution=block:block",
        f"--nodes={spec.nodes}",
        f"--ntasks-per-node={spec.ntasks // spec.nodes}",
        f"--cpus-per-task={_slurm_cpus(spec)}",
    ]
    if spec.cpu_bind:
        head.append(f"--cpu-bind={spec.cpu_bind}")
    return [*head, *tasklines.step_flags(spec), *badnodes.srun_flags(spec), *flags, *argv]


def plan_batch(spec: JobSpec, profile: Profile, paths: RunPaths, cwd: Path) -> BatchPlan:
    argv = task_argv(spec, profile.python, str(paths.bootstrap), containers.env_fd(spec.container))
    env = task_env(spec, profile, paths)
    argv, flags, files = containerlines.enter(
        spec, profile, paths, argv, env, uses_local(spec, env)
    )
    srun = srun_argv(spec, argv, flags)
    body: list[str] = ["#!/bin/bash", *directives(spec, paths, cwd)]
    body += [
        shell.comment(
            f"Generated by hpclaunch for run {paths.run_id} ({spec.cluster}); "
            "edit the command or hpclaunch.toml, not this file."
        ),
        *default_notes(spec, profile),
    ]
    if spec.setup:
        trap = shell.setup_failed_trap(str(paths.run_dir / node.EVENTS))
        body += ["", "# --setup lines (yours), stopped at the first failure", *trap, "set -e"]
        body += [*spec.setup, "set +e", shell.setup_trap_off()]
    body += rendezvous_lines(spec)
    attempts = bool(spec.requeue or spec.chain > 1)
    if attempts:
        body += requeue.attempt_lines(paths.run_dir / node.EVENTS, chain=spec.chain > 1)
    if uses_local(spec, env):
        body += local_lines(profile, paths)
    body += [shell.export(k, v) for k, v in env]
    secrets = spec.secret_env()
    if secrets:
        names = ", ".join(k for k, _ in secrets)
        body.append(shell.comment(f"From the submitting environment only (secret): {names}"))
    if node.HPCLAUNCH_ARGV in dict(env):
        why = "The program line holds a lone ':' (srun's step separator), so it reaches the "
        why += "bootstrap hex-encoded in HPCLAUNCH_ARGV: " + shell.command(list(spec.program))
        body.append(shell.comment(why))
    if spec.container:
        body += container_comment(spec, argv)
    staging = bool(spec.stage or spec.stage_out)
    if spec.requeue:
        body += ["", *requeue.start_lines(spec.requeue)]
    elif spec.chain > 1:
        body += ["", *requeue.resume_lines(spec.chain)]
    body += lostnodes.start_lines(spec, paths, profile.python)
    body += broadcast.lines(spec, profile, paths) + venvmount.start_lines(spec, profile, paths)
    body += stage_lines(spec, profile, paths) if staging else []
    srun_line = shell.join_multiline(srun[: len(srun) - len(argv)], argv)
    watch = gpu_watch_lines.watch_argv(spec, profile, paths) if spec.watch_interval_s else []
    body += scriptend.launch_lines(spec, watch, paths, srun_line, profile)
    return BatchPlan(
        script=shell.lines(body),
        sbatch_argv=("sbatch", "--parsable", str(paths.job_sh)),
        secret_env=tuple(secrets),
        task_argv=tuple(argv),
        task_env=tuple(env),
        srun_argv=tuple(srun),
        chain=spec.chain,
        watch_argv=tuple(watch),
        files=files,
    )


def preview(plan_: BatchPlan, environ: Mapping[str, str]) -> str:
    """The dry-run text: the script, the sbatch command, and what sbatch adds by itself."""
    out = [plan_.script.rstrip("\n"), "", "# submit with:"]
    if plan_.chain > 1:
        *head, script = plan_.sbatch_argv
        out.append(shell.command([*head, script, "0"]))
        for member in range(1, plan_.chain):
            after = f"--dependency=afterany:<job id of {member - 1}>"
            out.append(f"{shell.command([*head, after, script, str(member)])}")
    else:
        out.append(shell.command(plan_.sbatch_argv))
    sbatch_vars = sorted(k for k in environ if k.startswith("SBATCH_"))
    if sbatch_vars:
        out.append("# sbatch also reads from your environment:")
        out += [f"#   {k}={MASK if is_secret(k) else environ[k]}" for k in sbatch_vars]
    if plan_.secret_env:
        out.append("# secret variables passed through the environment only:")
        out += [f"#   {k}={MASK}" for k, _ in plan_.secret_env]
    return "\n".join(out) + "\n"


def task_env_values(plan_: BatchPlan, spec: JobSpec, known: Mapping[str, str]) -> dict[str, str]:
    """The exports of the batch script as values, for backends that start the tasks
    without that script (local processes, a step of the current allocation): expanded in
    order like bash would, OMP_NUM_THREADS only when `known` lacks it, secrets added."""
    env: dict[str, str] = {}
    if "OMP_NUM_THREADS" not in known:
        env["OMP_NUM_THREADS"] = str(spec.cpus_per_task)
    for name, word in plan_.task_env:
        env[name] = shell.expand(word, {**known, **env})
    env.update(dict(spec.secret_env()))
    return env


def rendezvous_lines(spec: JobSpec) -> list[str]:
    """MASTER_ADDR and MASTER_PORT (bash builtins only), and OMP_NUM_THREADS."""
    body: list[str] = []
    body += [
        "",
        "# The first node of the allocation: sbatch runs this script there, so it is this",
        "# node (no process needed); scontrol expands the node list where that is unknown.",
        "MASTER_ADDR=${SLURMD_NODENAME:-"
        '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}',
        "export MASTER_ADDR",
        "# From the job id, so jobs sharing a node differ; skip a port in use here.",
        f"MASTER_PORT=$(( {node.PORT_BASE} + SLURM_JOB_ID % {node.PORT_SPAN} ))",
        "for _ in {1..100}; do  # bash builtins only: no process is started here",
        '    { : 3<>"/dev/tcp/127.0.0.1/$MASTER_PORT"; } 2>/dev/null || break',
        "    MASTER_PORT=$(( MASTER_PORT + 1 ))",
        "done",
        "export MASTER_PORT",
        shell.export_default("OMP_NUM_THREADS", str(spec.cpus_per_task)),
    ]
    return body
