"""`hpclaunch top`: a run's GPUs as its GPU watch sampled them, live while it runs."""

from __future__ import annotations

import json
import sys

import click

from hpclaunch.cli.common import RUN_ARG_HELP, all_projects_flag, environ, find_run_dir


def _span(text: str) -> int:
    from hpclaunch.basics.units import parse_time
    from hpclaunch.errors import UserError, show

    try:
        return parse_time(text, "--span")
    except UserError:
        raise UserError(
            "--span",
            f"{show(text)} is not a stretch of time",
            "minutes (5), MM:SS or HH:MM:SS, more than 0",
            "Write e.g. --span 10 for ten minutes",
        ) from None


@click.command("top", epilog=RUN_ARG_HELP)
@click.argument("run")
@click.option(
    "--span",
    metavar="TIME",
    default="5",
    show_default=True,
    help="The sparklines' stretch on a running run: minutes, MM:SS or HH:MM:SS.",
)
@click.option("--once", is_flag=True, help="Print one view and exit, also on a running run.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (one view).")
@all_projects_flag
def top_cmd(run: str, span: str, once: bool, as_json: bool) -> int:
    """Show a run's GPUs: busy %, memory and power, live while it runs.

    For every node and GPU, as the run's GPU watch sampled them (metrics/gpu-<node>.csv):
    the busy %, the memory used (GiB), the power (W) and a sparkline of busy % over the
    last --span; above, the run's state and elapsed time; below, the input-bound warning
    when a node's watch recorded one.

    On a running run, on a terminal, the view refreshes (the samples every 2 s, the
    run's state from the scheduler at most every 10 s, backing off to 60 s while it does
    not change; never more often than the profile's min_poll_interval) until the run
    ends, then shows the finished run's view; Ctrl-C leaves.
    A finished run, --once, --json or output that is no terminal: one view. A finished
    run's view summarises its samples: busy % and power are means, memory the peak, the
    sparkline spans the whole run.

    Exit code 0; 1 when the run has no GPU samples, with one line on stderr saying why
    (no GPUs asked, --no-watch, no GPU tool on the nodes, not started yet)."""
    from hpclaunch.backends import runstatus
    from hpclaunch.basics import states
    from hpclaunch.observe import gpu_metrics, gpu_top

    span_s = _span(span)
    run_dir = find_run_dir(run)
    record = runstatus.refresh_one(run_dir)
    if states.is_open(record.state) and not (once or as_json) and sys.stdout.isatty():
        from rich.console import Console

        from hpclaunch.observe.waiting import site_floor

        floor = site_floor(record.cluster, environ())
        how = gpu_top.Live(Console(), runstatus.refresh_one, floor_s=floor)
        shown = gpu_top.live(run_dir, record, span_s, how)
        if shown is None or shown.gpus:
            return 0  # Ctrl-C, or the run's last view is on the screen
        record = shown.record
        view = shown
    else:
        reader = gpu_metrics.Reader(run_dir)
        reader.update()
        view = gpu_top.build(record, reader.series(), gpu_metrics.input_bound(run_dir), span_s)
    why = None if view.gpus else gpu_metrics.why_none(run_dir, record)
    if as_json:
        click.echo(json.dumps({**gpu_top.to_json(view), "no_samples": why}))
    elif view.gpus:
        click.echo("\n".join(gpu_top.lines(view)))
    if why is not None:
        click.echo(f"hpclaunch: top: run {record.run_id} has no GPU samples: {why}", err=True)
        return 1
    return 0
