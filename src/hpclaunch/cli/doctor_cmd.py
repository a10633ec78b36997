"""`hpclaunch doctor`: a site smoke test, one line a check with what to fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from hpclaunch.cli.common import environ


@click.command("doctor")
@click.option("--cluster", metavar="NAME", help="Cluster profile (default: as for run).")
@click.option("-N", "--nodes", type=int, default=2, show_default=True, help="Nodes to check.")
@click.option(
    "--tasks-per-node",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Ranks per node, as your runs will use (default: as for run, the profile's).",
)
@click.option("-p", "--partition", metavar="P", help="Partition (default: the profile's).")
@click.option("-A", "--account", metavar="A", help="Account to charge the short job to.")
@click.option("--container", metavar="IMAGE", help="Also check this image on the nodes.")
@click.option(
    "--container-runtime",
    type=click.Choice(["apptainer", "charliecloud", "pyxis", "ce", "podman-hpc"]),
    default=None,
    help="The image's runtime (default: the profile's).",
)
@click.option(
    "--python",
    default="python3",
    show_default=True,
    metavar="PATH",
    help="The ranks' Python (a training venv's, for the all-reduce through torch).",
)
@click.option(
    "--timeout",
    type=float,
    default=300,
    show_default=True,
    metavar="SECONDS",
    help="Longest wait for the job; after it the job is cancelled.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: every check.")
def doctor_cmd(
    cluster: Optional[str],
    nodes: int,
    tasks_per_node: Optional[int],
    partition: Optional[str],
    account: Optional[str],
    container: Optional[str],
    container_runtime: Optional[str],
    python: str,
    timeout: float,
    as_json: bool,
) -> int:
    """Check that this site runs hpclaunch jobs as its profile says, and say what to fix.

    \b
    Before submitting: the Slurm controller answers; enough nodes of the partition are
    up and not drained; the GPUs per node the profile claims against what the nodes
    declare; the image and the profile's binds where this host sees them. A check that
    cannot be met stops here: nothing is left in the queue.

    \b
    Then one short job (exp `doctor`, like any run: the profile's masks, the container,
    the bootstrap): the nodes it got; a step beside it with srun --overlap; the
    profile's binds and node-local space on every node; the GPUs each node's ranks see;
    the CPUs each rank may use against the profile's masks; the container and the site's
    network plugin in it; MASTER_ADDR:MASTER_PORT from every rank; an all-reduce through
    torch.distributed (nccl with GPUs, else gloo) and its bandwidth.

    Exit code 0 when no check failed (WARN lines are advice), else 1."""
    from hpclaunch.doctor import checks as doctor
    from hpclaunch.doctor.probejob import diagnose

    given = {
        "cluster": cluster,
        "nodes": nodes,
        "tasks_per_node": tasks_per_node,
        "partition": partition,
        "account": account,
        "container": container,
        "container_runtime": container_runtime,
    }
    given = {k: v for k, v in given.items() if v is not None}
    checks, extra = diagnose(
        given, python, timeout, Path.cwd(), environ(), lambda text: click.echo(text, err=True)
    )
    if as_json:
        click.echo(json.dumps(doctor.to_json(checks, extra)))
    else:
        for line in doctor.table(checks):
            click.echo(line)
    return 1 if doctor.failed(checks) else 0
