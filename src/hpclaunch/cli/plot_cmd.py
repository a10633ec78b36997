"""`hpclaunch plot`: a run's GPU samples over time as a PNG (and as CSV with --data)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from hpclaunch.cli.common import RUN_ARG_HELP, all_projects_flag, find_run_dir


@click.command("plot", epilog=RUN_ARG_HELP)
@click.argument("run")
@click.option(
    "--metric",
    type=click.Choice(["busy", "mem", "power"]),
    default="busy",
    show_default=True,
    help="Busy % (time a kernel ran), memory used (GiB) or power (W).",
)
@click.option(
    "-o", "--output", metavar="FILE.png", help="Default: <run folder>/metrics/gpu-<metric>.png."
)
@click.option("--data", metavar="FILE.csv", help="Also write the plotted samples as recorded.")
@click.option(
    "--size",
    metavar="WxH",
    help="The PNG's size in pixels (default 800x500, 200 taller per further row of nodes).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: the run, the PNG and CSV written (null where none), why no samples.",
)
@all_projects_flag
def plot_cmd(
    run: str,
    metric: str,
    output: Optional[str],
    data: Optional[str],
    size: Optional[str],
    as_json: bool = False,
) -> int:
    """Plot a run's GPU busy %, memory or power over time as a PNG.

    The samples of the run's GPU watch (metrics/gpu-<node>.csv): x is minutes since the
    run's first sample, one panel per node, one line per GPU (a GPU index has the same
    colour on every node). Prints the PNG's path.

    --data writes the plotted samples exactly as recorded (header
    time,node,gpu,busy_pct,mem_mib,power_w; node by node, in recorded order).

    A PNG needs matplotlib (pip install 'hpclaunch[plot]'): without it a hint, exit code
    0 if --data was written, else 1. A run without GPU samples: one line saying why,
    exit code 1."""
    from hpclaunch.backends import runstatus
    from hpclaunch.node import METRICS
    from hpclaunch.observe import gpu_metrics, gpu_plot
    from hpclaunch.records import runrecord

    asked = gpu_plot.parse_size(size) if size is not None else None
    run_dir = find_run_dir(run)
    run_id = runrecord.load(run_dir).run_id
    shown: dict[str, Optional[str]] = {"run_id": run_id, "png": None, "data": None}
    reader = gpu_metrics.Reader(run_dir)
    reader.update()
    found = reader.series()
    if not found:
        record = runstatus.refresh_one(run_dir)
        why = gpu_metrics.why_none(run_dir, record)
        click.echo(f"hpclaunch: plot: run {record.run_id} has no GPU samples: {why}", err=True)
        if as_json:
            click.echo(json.dumps({**shown, "no_samples": why}))
        return 1
    if data is not None:
        gpu_plot.write_data(reader, Path(data))
        shown["data"] = data
    path = Path(output) if output else run_dir / METRICS / f"gpu-{metric}.png"
    written = gpu_plot.png(run_id, found, metric, path, asked or gpu_plot.default_size(found))
    if written:
        shown["png"] = str(path)
    else:
        click.echo(gpu_plot.HINT, err=True)
    if as_json:
        click.echo(json.dumps({**shown, "no_samples": None}))
    elif written:
        click.echo(str(path))
    return 0 if written or data is not None else 1
