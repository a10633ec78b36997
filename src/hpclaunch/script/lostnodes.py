"""--requeue and --chain without --preflight/--spares: a node fault that ended the
previous attempt, found at the next one's start and excluded from later attempts. Pure:
render.py puts these lines into job.sh; node/preflight.py's `lost` does the work.

Why at the next attempt's start: without --no-kill, Slurm ends the whole job when one
of its nodes fails (NODE_FAIL), and the batch shell (on the lost node, or ended by
Slurm) writes no attempt_end. Slurm then requeues the job (--requeue) or the chain's
next member starts (afterany). What is observable then: the previous attempt's start
in events.jsonl (its $SLURM_JOB_NODELIST) without its end, and which of those nodes
Slurm shows down or not responding now (sinfo). Those nodes are named in the record
(`node_bad`) and join the exclusion carried across attempts (the run folder's `exclude`
file): the chain's later members get it at once (they are pending), a requeue gets it
when hpclaunch requeues the job (requeue.end_lines: ExcNodeList changes only while a
job is pending, scontrol(1), https://slurm.schedmd.com/scontrol.html#OPT_ExcNodeList).
The attempt that finds the loss runs where Slurm put it: never on a node Slurm shows
down (a node back in service by then is not seen as lost: docs/scale.md).
"""

from __future__ import annotations

from hpclaunch import node
from hpclaunch.basics import shell
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import badnodes, requeue


def wanted(spec: JobSpec) -> bool:
    """Whether the batch script looks for the previous attempt's lost nodes."""
    return bool(spec.requeue) or spec.chain > 1


def start_lines(spec: JobSpec, paths: RunPaths, python: str) -> list[str]:
    """After the attempt's start: the previous attempt's lost nodes, excluded."""
    if not wanted(spec):
        return []
    lost: list[shell.Word] = [
        python,
        *node.PYTHON_FLAGS,
        str(paths.shipped(node.PREFLIGHT)),
        "lost",
        "--events",
        str(paths.run_dir / node.EVENTS),
        "--attempt",
        shell.Var(node.HPCLAUNCH_ATTEMPT),
        "--exclude-file",
        str(paths.run_dir / requeue.EXCLUDE_FILE),
        "--exclude",
        dict(spec.slurm_flags).get("exclude", ""),
    ]
    lines = [
        "",
        "# A node fault that ended the previous attempt: its nodes Slurm shows down are",
        "# excluded from later attempts (node/preflight.py lost, script/lostnodes.py).",
        f"if (( {node.HPCLAUNCH_ATTEMPT} > 0 )); then",
        f"    HPCLAUNCH_EXCLUDE=$({shell.command(lost)})",
        '    if [ -n "$HPCLAUNCH_EXCLUDE" ]; then',
        '        echo "hpclaunch: the previous attempt lost a node; later attempts exclude '
        '$HPCLAUNCH_EXCLUDE"',
    ]
    if spec.chain > 1:
        lines += ["    " + line for line in badnodes.chain_exclude_lines(paths)]
    return [*lines, "    fi", "fi"]
