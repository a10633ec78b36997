"""The batch script's lines for a packed venv that each node mounts (no Apptainer to do
it): one node/venv_mount.py per node beside the ranks (srun --overlap), the wait until
every node says ready, and the end of those steps after the ranks'."""

from __future__ import annotations

from hpclaunch import node
from hpclaunch.basics import shell
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.profiles import Profile
from hpclaunch.payload import venvpack
from hpclaunch.records.runpaths import RunPaths

PID = "HPCLAUNCH_VENV_PID"


def mounts_on_nodes(spec: JobSpec) -> bool:
    return venvpack.mounts_on_nodes(spec.container, spec.venv_image)


def start_lines(spec: JobSpec, profile: Profile, paths: RunPaths) -> list[str]:
    if not mounts_on_nodes(spec):
        return []
    marks = str(paths.run_dir / node.VENV_MARKS)
    step = [
        # --ntasks too: srun would take the job's SLURM_NTASKS and start one per rank.
        "srun", "--overlap", f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1", "--cpus-per-task=1", "--kill-on-bad-exit=0",
        profile.python, *node.PYTHON_FLAGS, str(paths.shipped(node.VENV_MOUNT)),
        spec.venv_image, spec.venv, marks, str(paths.run_dir / node.BROADCAST_MAP),
    ]  # fmt: skip
    tag = '"$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"'
    quoted = shell.quote(marks)
    return [
        "",
        "# --venv: the packed venv, mounted with squashfuse at its original path on every",
        "# node (one step per node beside the ranks), so the ranks read one file of the",
        "# shared file system instead of the venv's thousands.",
        shell.comment(f"{spec.venv_image} -> {spec.venv}"),
        shell.command(step) + " &",
        f"{PID}=$!",
        "shopt -s nullglob",
        "while :; do  # until every node has it mounted; bash builtins but sleep",
        f"    ready=({quoted}/{node.READY}*.{tag}) failed=({quoted}/{node.FAILED}*.{tag})",
        f'    if (( ${{#failed[@]}} )) || ! kill -0 "${PID}" 2>/dev/null; then',
        '        echo "hpclaunch: mounting the packed venv failed; the ranks are not started" >&2',
        f'        kill -USR1 "${PID}" 2>/dev/null; wait "${PID}"',
        "        exit 1",
        "    fi",
        f"    (( ${{#ready[@]}} >= {spec.nodes} )) && break",
        "    sleep 0.1",
        "done",
        "shopt -u nullglob",
    ]


def end_lines() -> list[str]:
    return [
        "# The ranks are done: each node unmounts the packed venv (srun forwards SIGUSR1).",
        f'kill -USR1 "${PID}" 2>/dev/null',
        f'wait "${PID}"',
    ]
