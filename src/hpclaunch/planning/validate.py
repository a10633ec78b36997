"""Check a request against the cluster profile and build the JobSpec.

Every check raises UserError naming the field, the value, the limit and the fix,
so a bad request never waits hours in a queue (Slurm itself would often accept
it and leave it PENDING forever, e.g. a time over the partition's MaxTime).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Optional

from hpclaunch import backends, node
from hpclaunch.basics.shell import check_name
from hpclaunch.basics.users import user_name
from hpclaunch.config.jobspec import NO_PARTS, JobSpec, Launcher, Parts, Profiling, Requeue
from hpclaunch.config.options import RunOptions, slurm_lines
from hpclaunch.config.profiles import Partition, Profile
from hpclaunch.config.secretnames import is_secret
from hpclaunch.config.topology import map_cpu_bind, mask_cpu_bind
from hpclaunch.errors import UserError, show
from hpclaunch.planning.dependencies import check_chain
from hpclaunch.planning.resources import (
    MAX_LOCAL_RANKS,
    ResourceRequest,
    Resources,
    check_resources,
)
from hpclaunch.script import badnodes, gpu_watch_lines, profiling, requeue
from hpclaunch.slurm import sbatchargs

__all__ = ["MAX_LOCAL_RANKS", "Checked", "check", "default_job_name", "validate"]
_EXP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_INTERPRETER = re.compile(r"^(python[0-9.]*|torchrun|bash|sh|uv|apptainer|singularity)$")


def default_job_name(program: tuple[str, ...]) -> str:
    """The script or module a user recognises: `python -u train.py` -> train.py,
    `python -m pkg.main` -> pkg.main, `./run.sh` -> run.sh."""
    name = PurePosixPath(program[0]).name
    if not _INTERPRETER.match(name):
        return name or "job"
    args = iter(program[1:])
    for arg in args:
        if arg == "-m":
            return next(args, name)
        if arg == "-c":
            return name
        if not arg.startswith("-"):
            return PurePosixPath(arg).name or name
    return name


def _text(field: str, value: str, *, allow_blank: bool = True) -> str:
    if any(c in value for c in "\n\r\x00"):
        raise UserError(field, f"{show(value)} holds a line break or NUL", "", "Remove it")
    if not allow_blank and any(c.isspace() for c in value):
        raise UserError(field, f"{show(value)} holds blanks", "", "Remove them")
    return value


def _program(program: tuple[str, ...]) -> tuple[str, ...]:
    if not program:
        raise UserError(
            "PROGRAM",
            "missing",
            "",
            "Put the program after --: hpclaunch run -N 2 -- python train.py",
        )
    for arg in program:
        if "\x00" in arg:
            raise UserError("argument", f"{show(arg)} holds a NUL byte", "", "Remove it")
    if program[0] == "":
        raise UserError("PROGRAM", "is empty", "", "Name the program after --")
    return program


def _env(
    items: tuple[str, ...], profile: Profile, environ: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """--env KEY=VALUE, or --env NAME: NAME's value in the submitting environment. A
    profile's [env] secrets come first (--env wins): like --env secrets they travel in
    the environment of sbatch and the ranks only, never in job.sh (as they are: no shell
    expansion)."""
    pairs: dict[str, str] = {k: v for k, v in profile.env.items() if is_secret(k)}
    if profile.rendezvous_suffix:  # the bootstrap's MASTER_ADDR: <first node><suffix>
        pairs[node.HPCLAUNCH_MASTER_SUFFIX] = profile.rendezvous_suffix
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            check_name(name)
            if name not in environ:
                raise UserError(
                    "--env", f"{name} is not set in your environment", "", f"export {name}=..."
                )
            value = environ[name]
        check_name(name)
        if "\x00" in value:
            raise UserError("--env", f"{name}'s value holds a NUL byte", "", "Remove it")
        pairs[name] = value
    return tuple(pairs.items())


def _partition(profile: Profile, name: str) -> Optional[Partition]:
    if not profile.partitions:
        return None
    part = profile.partition(name)
    if part is None:
        raise UserError(
            "--partition",
            f"unknown partition {show(name)} on {profile.name}",
            f"known: {', '.join(sorted(profile.partitions))}",
            "Pick one of them",
        )
    return part


def _choose_partition(
    profile: Profile, options: RunOptions, local: bool, in_allocation: bool
) -> tuple[str, Optional[Partition]]:
    """The partition's name and facts; none locally, and inside an allocation the
    allocation already decided (its name is kept only when the user gave one)."""
    name = _text("--partition", options.partition or "", allow_blank=False)
    if local or in_allocation:
        return name, None
    name = name or profile.default_partition_name()
    return name, _partition(profile, name)


def _account(profile: Profile, options: RunOptions, local: bool) -> str:
    account = _text("--account", options.account or "", allow_blank=False)
    if profile.account_required and not account and not local:
        raise UserError(
            "--account",
            f"missing on {profile.name}",
            "every job needs a project account",
            "Give -A project_NNNNNNNNN or export SBATCH_ACCOUNT",
        )
    if account and profile.account_pattern and not re.match(profile.account_pattern, account):
        raise UserError(
            "--account",
            f"{show(account)} does not look like an account on {profile.name}",
            f"pattern {profile.account_pattern}",
            "Give e.g. -A project_465000000",
        )
    return account


def _job_name(options: RunOptions, program: tuple[str, ...]) -> str:
    job_name = _text("--job-name", options.job_name or default_job_name(program))
    if len(job_name) > 200:
        raise UserError("--job-name", f"{len(job_name)} characters", "at most 200", "Shorten it")
    # sbatch reads #SBATCH lines raw and a name with blanks gets double quotes: a quote
    # or backslash inside could not be written there.
    if '"' in job_name or "\\" in job_name:
        raise UserError(
            "--job-name", f"{show(job_name)} holds a quote or backslash", "", "Remove it"
        )
    return job_name


def _exp(options: RunOptions) -> str:
    exp = options.exp or "default"
    if not _EXP.match(exp):  # it becomes a folder of the run root
        raise UserError(
            "--exp",
            f"{show(exp)} is not a usable folder name",
            "letters, digits, . _ -; at most 100",
            "Rename the experiment",
        )
    return exp


def _setup(options: RunOptions, profile: Profile) -> tuple[str, ...]:
    return tuple(_text("--setup", line) for line in options.setup + profile.setup)


def _cpu_bind(
    profile: Profile, launcher: str, whole_or_exclusive: bool, tasks: int, local: bool
) -> str:
    """srun's --cpu-bind value: each task on its GPU's cores, only when the job owns the
    node and runs one srun task per GPU (else the masks would name cores it lacks)."""
    topo = profile.topology
    if (
        topo is None
        or profile.cpu_bind == "none"
        or launcher != "srun"
        or not whole_or_exclusive
        or tasks != topo.gpus
        or local
    ):
        return ""
    verbose = profile.cpu_bind_verbose
    if profile.cpu_bind == "mask":
        return mask_cpu_bind(topo, verbose)
    return map_cpu_bind(topo, verbose)


def _run_roots(
    profile: Profile,
    options: RunOptions,
    account: str,
    environ: Mapping[str, str],
    project: str,
) -> tuple[str, str]:
    """Where runs and checkpoints go: --run-root, else the profile's pattern ($SCRATCH's
    when the site sets it) filled with the account, user, project and scratch."""
    fmt = {
        "account": account or "noaccount",
        "user": user_name(environ),
        "project": project,
        "scratch": environ.get("SCRATCH", ""),
    }
    root = profile.scratch_run_root if fmt["scratch"] and profile.scratch_run_root else ""
    run_root = options.run_root or (root or profile.run_root).format(**fmt)
    ckpt_root = profile.checkpoint_root.format(**fmt) if profile.checkpoint_root else ""
    return run_root, ckpt_root


@dataclass(frozen=True)
class Checked:
    """A request checked against its profile, every check passed: what the features
    (planning/preparing.py: snapshot, --after, staging, container) build their parts on, and
    what `spec` makes the JobSpec of, once, with those parts."""

    profile: Profile
    program: tuple[str, ...]
    project: str
    sources: tuple[tuple[str, str], ...]
    partition: str
    res: Resources
    account: str
    job_name: str
    exp: str
    setup: tuple[str, ...]
    launcher: Launcher
    cpu_bind: str
    run_root: str
    checkpoint_root: str
    requeue: Optional[Requeue]
    chain: int
    watch_interval_s: float
    watch_window: tuple[Optional[float], Optional[float]]  # (window, warm-up) s; None: default
    profiling: Optional[Profiling]
    env: tuple[tuple[str, str], ...]
    sbatch_args: tuple[str, ...]
    slurm_flags: tuple[tuple[str, str], ...]
    sbatch_spellings: tuple[tuple[str, str], ...]
    options: RunOptions
    spares: int = 0

    def spec(self, parts: Parts = NO_PARTS) -> JobSpec:
        res, profile, options = self.res, self.profile, self.options
        return JobSpec(
            cluster=profile.name,
            program=self.program,
            nodes=res.nodes,
            tasks_per_node=res.tasks_per_node,
            gpus_per_node=res.gpus_per_node,
            cpus_per_task=res.cpus_per_task,
            mem_mb=res.mem_mb,
            mem_per_gpu_mb=res.mem_per_gpu_mb,
            time_s=res.time_s,
            partition=self.partition,
            account=self.account,
            slurm_flags=self.slurm_flags,
            sbatch_spellings=self.sbatch_spellings,
            exclusive=options.exclusive,
            overcommit=options.overcommit,
            node_logs=res.nodes * res.tasks_per_node > profile.node_logs_above,
            job_name=self.job_name,
            launcher=self.launcher,
            gpu_visibility=options.gpu_visibility or profile.gpu_visibility,
            exp=self.exp,
            project=self.project,
            env=self.env,
            setup=self.setup,
            sbatch_args=self.sbatch_args,
            run_root=self.run_root,
            share=options.share or profile.share,
            checkpoint_root=self.checkpoint_root,
            nccl_debug=options.nccl_debug,
            profiling=self.profiling,
            watch_interval_s=self.watch_interval_s,
            watch_window_s=self.watch_window[0],
            watch_warmup_s=self.watch_window[1],
            cpu_bind=self.cpu_bind,
            requeue=self.requeue,
            chain=self.chain,
            preflight=options.preflight,
            spares=self.spares,
            snapshot=parts.snapshot,
            snapshot_limit_bytes=parts.snapshot_limit_bytes,
            dependency=parts.dependency,
            stage=parts.stage,
            stage_out=parts.stage_out,
            local_dir=parts.local_dir,
            container=parts.container,
            venv=parts.venv,
            venv_image=parts.venv_image,
            sources=self.sources,
        )


def validate(
    profile: Profile,
    options: RunOptions,
    sources: Mapping[str, str],
    program: tuple[str, ...],
    environ: Mapping[str, str],
    in_allocation: bool,
    project: str = "",
) -> JobSpec:
    """The JobSpec of a request without the features' parts (check(), then spec())."""
    return check(profile, options, sources, program, environ, in_allocation, project).spec()


def check(
    profile: Profile,
    options: RunOptions,
    sources: Mapping[str, str],
    program: tuple[str, ...],
    environ: Mapping[str, str],
    in_allocation: bool,
    project: str = "",
) -> Checked:
    """Every check, in the order its error is reported; the first broken one raises."""
    program = _program(program)
    local = backends.chosen(profile, in_allocation).runs_here  # asked, never named
    partition_name, part = _choose_partition(profile, options, local, in_allocation)
    launcher = options.launcher or profile.launcher
    res = check_resources(
        ResourceRequest(profile, part, partition_name, options, sources, local, in_allocation)
    )
    account = _account(profile, options, local)
    job_name = _job_name(options, program)
    exp = _exp(options)
    setup = _setup(options, profile)
    whole = bool(part and part.whole_node)
    cpu_bind = _cpu_bind(profile, launcher, whole or options.exclusive, res.tasks_per_node, local)
    run_root, ckpt_root = _run_roots(profile, options, account, environ, project)
    limit = res.time_s or (part.default_time or part.max_time if part else None)
    requeued = requeue.from_values(options, limit, local=local, in_allocation=in_allocation)
    chain = check_chain(options, local=local, in_allocation=in_allocation)
    path = environ.get("PATH", "")
    watch_s = gpu_watch_lines.interval_from_values(options, res.gpus_per_node, local, path)
    world_size = res.nodes * res.tasks_per_node
    arch = "" if local else profile.arch  # a local run's ranks run on this machine
    profiled = profiling.from_values(options, world_size, local, environ, arch)
    return Checked(
        profile=profile,
        program=program,
        project=project,
        sources=tuple(sorted(sources.items())),
        partition=partition_name,
        res=res,
        account=account,
        job_name=job_name,
        exp=exp,
        setup=setup,
        launcher=launcher,
        cpu_bind=cpu_bind,
        run_root=run_root,
        checkpoint_root=ckpt_root,
        requeue=requeued,
        chain=chain,
        watch_interval_s=watch_s,
        watch_window=gpu_watch_lines.window_from_values(options),
        profiling=profiled,
        env=_env(options.env, profile, environ),
        # The site's mandatory companions (a profile's sbatch_args: Perlmutter's -C gpu) first.
        sbatch_args=(*profile.sbatch_args, *sbatchargs.sbatch_args(options.sbatch_arg)),
        slurm_flags=slurm_lines(options),
        sbatch_spellings=sbatchargs.spellings(profile),
        options=options,
        spares=badnodes.spares_from_values(
            options, launcher, local=local, in_allocation=in_allocation
        ),
    )
