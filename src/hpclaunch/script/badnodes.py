"""--preflight and --spares: the options checked, and the batch-shell text that keeps
the ranks off bad nodes. Pure: scriptend.py puts these lines into job.sh; the work on
the nodes is node/preflight.py's (docs/scale.md for users).

What the batch shell does, and why:

- `--spares S` asks Slurm for S more nodes and `--no-kill`, so that the loss of a node
  leaves the allocation (and the batch shell) alive (sbatch(1), --no-kill: "the job
  allocation will not be revoked so the user may launch new job steps on the remaining
  nodes", https://slurm.schedmd.com/sbatch.html#OPT_no-kill).
- `--preflight` runs node/preflight.py once per node before the ranks; a node that
  fails is bad (a `node_bad` event names it and why).
- The ranks' srun keeps its layout (--nodes=N, the same tasks per node) and is kept off
  the bad nodes and, while a spare is left, the batch host, by
  `--exclude="$HPCLAUNCH_AVOID"` (an empty value excludes nothing: checked on Slurm
  22.05; srun's SLURM_EXCLUDE variable was not honoured there), the GPU watch's srun
  too. MASTER_ADDR is left to the bootstrap (the step's first node), since the ranks
  may not run on the batch host.
- When the step fails and Slurm shows one of its nodes down (preflight.py faults), the
  step starts again on a spare in the same allocation with HPCLAUNCH_RESUME=1.
- No good node left for the layout: with --requeue (budget left) the job is queued again
  with the bad nodes excluded (`scontrol requeuehold`, `update ExcNodeList`, `release`:
  ExcNodeList can only change while a job is pending, scontrol(1),
  https://slurm.schedmd.com/scontrol.html#OPT_ExcNodeList); with --chain the later
  members get the exclusion (they are pending); otherwise the job fails naming the node.
"""

from __future__ import annotations

import json

from hpclaunch import node
from hpclaunch.basics import shell
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.options import RunOptions
from hpclaunch.errors import UserError
from hpclaunch.payload import containers
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script.requeue import EXCLUDE_FILE

MAX_SPARES = 1024  # a typo guard
PREFLIGHT_DIR = "preflight"  # in the run folder: attempt-N/<node>.json
AVOID = "HPCLAUNCH_AVOID"  # the nodes the ranks' step is kept off, comma-joined


def spares_from_values(
    options: RunOptions, launcher: str, *, local: bool, in_allocation: bool
) -> int:
    """--spares N checked (0 when not given); --preflight's own conditions too."""
    where = "a local run" if local else "a step of the current allocation"
    for name, given in (("--preflight", options.preflight), ("--spares", options.spares)):
        if given and (local or in_allocation):
            raise UserError(
                name,
                f"not for {where}",
                "only a batch job chooses among its nodes",
                f"Submit it to a Slurm cluster (--cluster slurm), or drop {name}",
            )
    spares = options.spares or 0
    if not 0 <= spares <= MAX_SPARES:
        raise UserError("--spares", str(spares), f"0 to {MAX_SPARES}", "Give e.g. --spares 1")
    if spares and launcher == "torchrun":
        raise UserError(
            "--spares",
            f"{spares} with --launcher torchrun",
            "torchrun's rendezvous names the batch host, which a spare run avoids",
            "Use --launcher srun, or drop --spares",
        )
    if spares and (options.stage or options.stage_out):
        raise UserError(
            "--spares",
            f"{spares} with --stage/--stage-out",
            "data is staged on the first nodes, before the ranks' nodes are known",
            "Drop --spares, or stage inside the program",
        )
    return spares


def placing(spec: JobSpec) -> bool:
    """Whether the batch shell chooses the ranks' nodes (and ships preflight.py)."""
    return spec.preflight or spec.spares > 0


def directives(spec: JobSpec) -> list[str]:
    """#SBATCH lines beside --nodes (which counts the spares: render.directives):
    --no-kill with spares, and with --preflight and a later attempt to exclude a lost
    node from (--requeue, --chain): the batch shell outlives the node and says which."""
    later = spec.preflight and (spec.requeue is not None or spec.chain > 1)
    return [shell.sbatch_line("--no-kill")] if spec.spares or later else []


def srun_flags(spec: JobSpec) -> list[shell.Word]:
    """The ranks' srun: kept off $HPCLAUNCH_AVOID (hpclaunch_place's; empty: no node),
    and with spares --ntasks, since the job's SLURM_NTASKS counts the spares' tasks too."""
    if not placing(spec):
        return []
    avoid: list[shell.Word] = [shell.Join(("--exclude=", shell.Var(AVOID)))]
    return [*avoid, f"--ntasks={spec.ntasks}"] if spec.spares else avoid


def watch_lines(spec: JobSpec, lines: list[str]) -> list[str]:
    """The GPU watch's step on the ranks' nodes: its srun kept off the same nodes."""
    if not placing(spec):
        return lines
    start, kept_off = "exec srun ", f'exec srun --exclude="${AVOID}" '
    return [line.replace(start, kept_off, 1) for line in lines]


def _script(paths: RunPaths, python: str) -> str:
    return shell.command([python, *node.PYTHON_FLAGS, str(paths.shipped(node.PREFLIGHT))])


def setup_lines(spec: JobSpec, paths: RunPaths, local_dir: str, python: str) -> list[str]:
    """Before the ranks' step: the tools, the checks (--preflight), the placement."""
    events = shell.quote(str(paths.run_dir / node.EVENTS))
    lines = [
        "",
        "# --preflight/--spares: the ranks run on good nodes only (node/preflight.py).",
        f"HPCLAUNCH_PLACE=({_script(paths, python)})",
        'HPCLAUNCH_PLACE_ARGS=(--nodes "$SLURM_JOB_NODELIST" '
        f'--events {events} --attempt "${{{node.HPCLAUNCH_ATTEMPT}:-0}}")',
        "HPCLAUNCH_BAD= HPCLAUNCH_TRY=0",
    ]
    if spec.preflight:
        lines += preflight_lines(spec, paths, local_dir)
    need = spec.nodes
    lines += [
        "hpclaunch_place() {  # the nodes srun excludes; fails when too few good ones are left",
        '    HPCLAUNCH_AVOID=$("${HPCLAUNCH_PLACE[@]}" place "${HPCLAUNCH_PLACE_ARGS[@]}" '
        f'--need {need} --avoid "$HPCLAUNCH_BAD" --host "${{SLURMD_NODENAME-}}") || return 1',
        "    unset MASTER_ADDR  # the bootstrap takes the step's first node",
        "}",
        *no_spare_lines(spec, paths),
    ]
    return lines


def preflight_lines(spec: JobSpec, paths: RunPaths, local_dir: str) -> list[str]:
    folder = shell.quote(str(paths.run_dir / PREFLIGHT_DIR))
    out = f'{folder}/"attempt-${{{node.HPCLAUNCH_ATTEMPT}:-0}}"'
    check: list[shell.Word] = [
        "check",
        "--out",
        shell.Var("HPCLAUNCH_PRE_DIR"),
        "--gpus",
        str(spec.gpus_per_node),
    ]
    check += ["--local", shell.Var("HPCLAUNCH_PRE_LOCAL")]
    if spec.container:
        check += ["--container", json.dumps([*containers.runtime_argv(spec.container), "true"])]
    return [
        f"HPCLAUNCH_PRE_DIR={out}",
        f"HPCLAUNCH_PRE_LOCAL={local_dir}",
        'mkdir -p -m 700 "$HPCLAUNCH_PRE_DIR"',
        'echo "hpclaunch: preflight checks on ${SLURM_JOB_NODELIST}"',
        'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" '
        '--ntasks-per-node=1 --kill-on-bad-exit=0 "${HPCLAUNCH_PLACE[@]}" ' + shell.command(check),
        'HPCLAUNCH_BAD=$("${HPCLAUNCH_PLACE[@]}" verdict --out "$HPCLAUNCH_PRE_DIR" '
        '"${HPCLAUNCH_PLACE_ARGS[@]}")',
    ]


def no_spare_lines(spec: JobSpec, paths: RunPaths) -> list[str]:
    """hpclaunch_no_spare: too few good nodes for the layout. Requeue around them (with
    --requeue and budget left), exclude them from the chain's later members, or fail."""
    excluded = shell.quote(str(paths.run_dir / EXCLUDE_FILE))
    events = shell.quote(str(paths.run_dir / node.EVENTS))
    user = dict(spec.slurm_flags).get("exclude", "")
    lines = [
        "hpclaunch_no_spare() {",
        '    echo "hpclaunch: no spare node left for the ranks (bad: $HPCLAUNCH_BAD)"',
        f"    local had={shell.quote(user)}",
        f"    [ -r {excluded} ] && read -r had <{excluded}",
        '    HPCLAUNCH_EXCLUDE="${had:+$had,}$HPCLAUNCH_BAD"',
        f'    printf "%s\\n" "$HPCLAUNCH_EXCLUDE" >{excluded}',
        '    printf \'{"event":"exclude","attempt":%d,"nodes":"%s"}\\n\' '
        f'"${{{node.HPCLAUNCH_ATTEMPT}:-0}}" "$HPCLAUNCH_EXCLUDE" >>{events}',
    ]
    if spec.requeue:
        most = spec.requeue.max_requeues
        lines += [
            f"    if (( {node.HPCLAUNCH_ATTEMPT} < {most} )); then",
            '        echo "hpclaunch: requeueing job $SLURM_JOB_ID without $HPCLAUNCH_EXCLUDE"',
            "        hpclaunch_event attempt_end "
            '\'"reason":"requeued","why":"bad-node","exit_code":1,\'',
            f'        : >"$HPCLAUNCH_RUN_DIR/requeued-${node.HPCLAUNCH_ATTEMPT}"',
            "        trap '' TERM  # the requeue ends this job: finish the three calls first",
            '        local id="$SLURM_JOB_ID"',
            '        [ -n "${SLURM_ARRAY_JOB_ID-}" ] && '
            'id="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
            '        if scontrol requeuehold "$id"; then',
            '            scontrol update JobId="$id" ExcNodeList="$HPCLAUNCH_EXCLUDE"',
            '            scontrol release "$id"',
            "            while :; do sleep 60 & wait $!; done",
            "        fi",
            "    fi",
        ]
    if spec.chain > 1:
        lines += chain_exclude_lines(paths)
    if spec.requeue or spec.chain > 1:  # the attempt's end, for `status`'s attempt lines
        lines.append('    hpclaunch_event attempt_end \'"reason":"ended","exit_code":1,\'')
    lines += [
        '    echo "hpclaunch: failed: node(s) $HPCLAUNCH_BAD cannot run the ranks" >&2',
        "    exit 1",
        "}",
    ]
    return lines


def chain_exclude_lines(paths: RunPaths) -> list[str]:
    """The chain's later members (pending) exclude $HPCLAUNCH_EXCLUDE (lines indented once)."""
    jobs = shell.quote(str(paths.run_dir / "chain.jobs"))
    return [
        f"    mapfile -t HPCLAUNCH_CHAIN <{jobs} 2>/dev/null",
        f'    for id in "${{HPCLAUNCH_CHAIN[@]:$(( {node.HPCLAUNCH_ATTEMPT} + 1 ))}}"; do',
        '        scontrol update JobId="$id" ExcNodeList="$HPCLAUNCH_EXCLUDE" && '
        'echo "hpclaunch: job $id (next in the chain) excludes $HPCLAUNCH_EXCLUDE"',
        "    done",
    ]


def loop_lines(spec: JobSpec, paths: RunPaths, step: list[str]) -> list[str]:
    """The ranks' step (`step`: it sets HPCLAUNCH_RC), placed, and started again on a
    spare while a node fault ended it and a good node is left."""
    events = shell.quote(str(paths.run_dir / node.EVENTS))
    inner = [
        "while :; do",
        "    hpclaunch_place || hpclaunch_no_spare",
        "    (( HPCLAUNCH_TRY )) && export HPCLAUNCH_RESUME=1 && echo \"hpclaunch: the ranks' "
        'step again (try $HPCLAUNCH_TRY), without $HPCLAUNCH_AVOID"',
        "    printf -v HPCLAUNCH_STEP_AT '%(%s)T' -1",
        *("    " + line for line in step),
        "    (( ${HPCLAUNCH_SIGNALLED:-0} )) && break",
        "    # srun may return 0 after it lost a node: the ranks' exit files say.",
        '    HPCLAUNCH_LOST=$("${HPCLAUNCH_PLACE[@]}" faults "${HPCLAUNCH_PLACE_ARGS[@]}" '
        '--avoid "$HPCLAUNCH_BAD" --since "$HPCLAUNCH_STEP_AT" --log-dir "$HPCLAUNCH_LOG_DIR" '
        f"--ranks {spec.ntasks})",
        '    [ -n "$HPCLAUNCH_LOST" ] || break  # the program ended (well or not), no node failed',
        '    echo "hpclaunch: node(s) $HPCLAUNCH_LOST failed during the ranks\' step"',
        '    HPCLAUNCH_BAD="${HPCLAUNCH_BAD:+$HPCLAUNCH_BAD,}$HPCLAUNCH_LOST"',
        "    HPCLAUNCH_TRY=$(( HPCLAUNCH_TRY + 1 ))",
        '    printf \'{"event":"step_restart","attempt":%d,"try":%d,"lost":"%s"}\\n\' '
        f'"${{{node.HPCLAUNCH_ATTEMPT}:-0}}" "$HPCLAUNCH_TRY" "$HPCLAUNCH_LOST" >>{events}',
        "done",
    ]
    return inner
