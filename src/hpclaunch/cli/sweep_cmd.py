"""`hpclaunch sweep`: submit a sweep (every run option + sweep options), and its
subcommands status, wait, retry, cancel, throttle, plot, wandb-template."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import click

from hpclaunch.cli.common import all_projects_flag
from hpclaunch.cli.run_cmd import _with_options
from hpclaunch.cli.sweep_pack import pack_options, take_pack_options

SWEEP_HELP = """Run PROGRAM once per point of a hyper-parameter sweep: one Slurm job array.

\b
  hpclaunch sweep [RUN OPTIONS] [SWEEP OPTIONS] -- PROGRAM [ARGS]...
  hpclaunch sweep status|wait|retry|cancel|throttle|plot SWEEP ...

\b
Every point is a complete run (nodes, ranks, containers, staging: every run option).
Points come from --grid NAME=V1,V2 (repeatable: the product), --configs FILE (.txt: one
line of extra arguments per point; .json/.jsonl/.toml/.yaml: a list of NAME -> value
mappings), --repeat N (parameter seed = 0..N-1) or --optuna SPACE --trials N --metric M.
A point's program sees {name} placeholders expanded in its arguments (beside {rank};
{{x}} is a literal {x}), HPCLAUNCH_PARAM_<NAME>, HPCLAUNCH_PARAMS (JSON),
HPCLAUNCH_SWEEP_ID, HPCLAUNCH_POINT, HPCLAUNCH_POINTS, and HPCLAUNCH_RESULT_FILE,
where rank 0 writes its metrics as a JSON object.

\b
SWEEP is a sweep id, a unique prefix, an array job id, its folder or `last` (the newest
sweep); a point is SWEEP:INDEX wherever a command takes a run (logs, status, show, cancel).
"""


class _SweepGroup(click.Group):
    """`sweep -- PROGRAM` submits; `sweep status ...` and the others are subcommands."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and (args[0] in self.commands or args[0] in ("-h", "--help")):
            return super().parse_args(ctx, args)
        if args and not args[0].startswith("-"):  # an option: no subcommand's name (no difflib)
            self._refuse_mistyped_subcommand(args[0])
        return super().parse_args(ctx, ["submit", *args])

    def _refuse_mistyped_subcommand(self, word: str) -> None:
        """`sweep stats` is a mistyped `sweep status`, not a program to sweep: a program
        comes after --, and a word this close to a subcommand's name is refused."""
        from difflib import get_close_matches

        from hpclaunch.errors import UserError, show

        names = [name for name, cmd in self.commands.items() if not cmd.hidden]
        close = get_close_matches(word, names, n=1)
        if close:
            raise UserError(
                "sweep",
                f"no subcommand {show(word)}",
                f"one of {', '.join(sorted(names))}",
                f"Did you mean hpclaunch sweep {close[0]}? A program to sweep goes after --",
            )

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The submitting form's help (every run and sweep option), then the subcommands."""
        submit = self.commands["submit"]
        submit.format_help(
            click.Context(
                submit,
                info_name=ctx.info_name,
                parent=ctx.parent,
                max_content_width=ctx.max_content_width,
            ),
            formatter,
        )
        self.format_commands(ctx, formatter)


@click.group("sweep", cls=_SweepGroup, help=SWEEP_HELP)
def sweep_group() -> None:
    pass


@sweep_group.command(
    "submit",
    hidden=True,
    help=SWEEP_HELP,
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": False},
)
@_with_options
@click.option(
    "--grid",
    "grids",
    multiple=True,
    metavar="NAME=V1,V2,...",
    help="A parameter and its values (repeatable: the Cartesian product).",
)
@click.option(
    "--configs",
    metavar="FILE",
    help="One configuration per point: .txt (extra arguments per line), "
    ".json, .jsonl, .toml ([[points]]) or .yaml (a list of mappings).",
)
@click.option(
    "--repeat", type=int, metavar="N", help="Every point N times with the parameter seed = 0..N-1."
)
@click.option(
    "--max-parallel",
    type=int,
    metavar="P",
    help="At most P points at once (local default 1). Change later: sweep throttle.",
)
@click.option(
    "--optuna",
    metavar="SPACE_FILE",
    help="Asynchronous Optuna search over the space in this TOML/YAML file.",
)
@click.option("--trials", type=int, metavar="N", help="Optuna: number of trials (points).")
@click.option(
    "--metric",
    metavar="NAME",
    help="The result key to optimise (Optuna), else to name the best point by: sweep "
    "status and a local sweep's summary remember it.",
)
@click.option(
    "--direction",
    type=click.Choice(["minimize", "maximize"]),
    default="minimize",
    help="Minimize (default) or maximize the metric.",
)
@click.option(
    "--wandb-sweep",
    metavar="ENTITY/PROJECT/ID",
    help="A W&B sweep: each point runs `wandb agent --count 1` on its batch host, whose "
    "`hpclaunch run -- ...` command starts the point's ranks (see sweep wandb-template).",
)
@click.option("--count", type=int, metavar="N", help="W&B: the number of points (agent runs).")
@pack_options
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the array script(s), the sbatch line(s) and the point table.",
)
@click.option("--wait", is_flag=True, help="Follow the sweep until every point ended.")
@click.option("--json", "as_json", is_flag=True, help='Print {"sweep_id": ..., "job_ids": [...]}.')
@click.argument("program", nargs=-1, type=click.UNPROCESSED, metavar="-- PROGRAM [ARGS]...")
def submit_cmd(
    program: tuple[str, ...],
    grids: tuple[str, ...],
    configs: Optional[str],
    repeat: Optional[int],
    max_parallel: Optional[int],
    optuna: Optional[str],
    trials: Optional[int],
    metric: Optional[str],
    direction: str,
    wandb_sweep: Optional[str],
    count: Optional[int],
    dry_run: bool,
    wait: bool,
    as_json: bool,
    **options: Any,
) -> int:
    from hpclaunch.api import request
    from hpclaunch.cli.sweep_report import submit_and_report
    from hpclaunch.sweeps.plans import SweepOptions

    points = (grids, configs, repeat, max_parallel, optuna, trials, metric, direction)
    opts = SweepOptions(*points, wandb_sweep, count, **take_pack_options(options))
    given = {k: v for k, v in options.items() if v is not None and v != ()}  # --pack's out
    req = request(program, given, argv=sys.argv)
    return submit_and_report(req, opts, dry_run=dry_run, wait=wait, as_json=as_json)


@sweep_group.command("wandb-template")
@click.option("--json", "as_json", is_flag=True, help='One JSON object: {"yaml": TEXT}.')
@click.argument("program", nargs=-1, type=click.UNPROCESSED, metavar="PROGRAM")
def wandb_template_cmd(program: tuple[str, ...], as_json: bool) -> int:
    """Print a W&B sweep YAML whose command is `hpclaunch run -- ${interpreter} ${program}
    ${args}`, with the settings that matter on Slurm (create it with `wandb sweep`)."""
    from hpclaunch.sweeps.wandb import template

    text = template(program)
    sys.stdout.write(json.dumps({"yaml": text}) + "\n" if as_json else text)
    return 0


@sweep_group.command("status")
@click.argument("sweep")
@click.option("--metric", metavar="NAME", help="Also name the best point by this result key.")
@click.option(
    "--direction",
    type=click.Choice(["minimize", "maximize"]),
    default=None,
    help="Best = lowest (minimize, default) or highest value.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: sweep_id, points, best.")
@click.option(
    "--points",
    "points_only",
    is_flag=True,
    help="With --json: a listing, one object per point and line (not one for the sweep).",
)
@all_projects_flag
def status_cmd(
    sweep: str, metric: Optional[str], direction: Optional[str], as_json: bool, points_only: bool
) -> int:
    """The point table (index, parameters, state, exit code, metrics, attempts), the
    counts per state and, with --metric, the best point."""
    from hpclaunch.cli.common import environ
    from hpclaunch.cli.sweep_report import print_status

    if points_only and as_json:  # a listing: one object per line (docs/json.md)
        from hpclaunch.backends import sweepstate
        from hpclaunch.cli.common import find_sweep_dir

        found = sweepstate.refresh(find_sweep_dir(sweep))
        for rec in found.points:
            click.echo(json.dumps(sweepstate.point_row(found, rec)))
        return 0

    return print_status(sweep, environ(), metric, direction, as_json)


@sweep_group.command("wait")
@click.argument("sweep")
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Refresh every SECONDS (not below the cluster's min_poll_interval); default: "
    "backed off, at most 6 Slurm calls a minute once the points have pended a minute.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object when the sweep has ended (its counts, exit code); progress on stderr.",
)
@all_projects_flag
def wait_cmd(sweep: str, interval: Optional[float], as_json: bool) -> int:
    """Follow SWEEP until every point ended: exit 0 when all completed, else the
    lowest-index failed point's code. Only the points still open are read again."""
    from hpclaunch.cli.common import environ, find_sweep_dir
    from hpclaunch.observe import waiting
    from hpclaunch.records import sweeprecord
    from hpclaunch.sweeps import ops

    env = environ()
    folder = find_sweep_dir(sweep)
    floor = waiting.site_floor(str(sweeprecord.load(folder).get("cluster") or ""), env)
    if interval is not None and interval < floor:
        click.echo(
            f"hpclaunch: --interval {interval:g} is below the cluster's min_poll_interval "
            f"{floor:g}: refreshing every {floor:g} s",
            err=True,
        )
    backoff = waiting.Backoff(floor_s=floor, every_s=interval)
    if not as_json:
        return ops.wait(folder, sys.stdout, sys.stdout.isatty(), backoff=backoff)
    code = ops.wait(folder, sys.stderr, sys.stderr.isatty(), backoff=backoff)
    _echo_sweep_end(folder, code)
    return code


def _echo_sweep_end(folder: Any, code: int) -> None:
    """The one JSON object of an ended sweep: its id, counts per state, exit code."""
    from hpclaunch.backends import sweepstate

    found = sweepstate.load(folder)
    click.echo(
        json.dumps({"sweep_id": found.sweep_id, "counts": found.counts(), "exit_code": code})
    )


@sweep_group.command("retry")
@click.argument("sweep")
@click.option("--failed", is_flag=True, help="Every point that did not complete (the default).")
@click.option("--points", metavar="3,7,10-12", help="Just these points.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: the points resubmitted, the new arrays (points run here: their "
    "exit code, their output on stderr).",
)
@all_projects_flag
def retry_cmd(sweep: str, failed: bool, points: Optional[str], as_json: bool) -> int:
    """Resubmit only some points, as one array of just them, into the same sweep
    (earlier attempts' logs are kept under the point's attempts/)."""
    from hpclaunch.cli.sweep_report import retry_and_report

    return retry_and_report(sweep, failed, points, as_json)


@sweep_group.command("cancel")
@click.argument("sweep")
@click.option("--points", metavar="3,7", help="Just these points (default: every open one).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: what was cancelled.")
@all_projects_flag
def cancel_cmd(sweep: str, points: Optional[str], as_json: bool) -> int:
    """Cancel every pending or running point of SWEEP, or just some (one scancel)."""
    from hpclaunch.cli.common import find_sweep_dir
    from hpclaunch.records import sweeprecord
    from hpclaunch.sweeps import ops

    folder = find_sweep_dir(sweep)
    total = len(sweeprecord.load(folder)["points"])
    chosen = ops.parse_points(points, total) if points else None
    done = ops.cancel(folder, chosen)
    if as_json:
        click.echo(json.dumps({"sweep_id": folder.name, "cancelled": done}))
        return 0
    print(f"cancelled: {' '.join(done)}" if done else "nothing to cancel: no point is open")
    return 0


@sweep_group.command("throttle")
@click.argument("sweep")
@click.argument("parallel", metavar="P", type=int)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the new limit per array.")
@all_projects_flag
def throttle_cmd(sweep: str, parallel: int, as_json: bool) -> int:
    """At most P points of SWEEP at once from now on (scontrol update ArrayTaskThrottle)."""
    from hpclaunch.cli.common import find_sweep_dir
    from hpclaunch.sweeps import ops

    folder = find_sweep_dir(sweep)
    done = ops.throttle(folder, parallel)
    if as_json:
        arrays = [{"job_id": array_id, "max_parallel": value} for array_id, value in done]
        click.echo(
            json.dumps({"sweep_id": folder.name, "max_parallel": parallel, "arrays": arrays})
        )
        return 0
    for array_id, value in done:
        print(f"array {array_id}: at most {value} at once")
    if not done:
        print(f"sweep {folder.name}: at most {parallel} points at once from now on")
    return 0


@sweep_group.command("plot")
@click.argument("sweep")
@click.option("--x", "x", metavar="NAME", help="The parameter on the x axis.")
@click.option(
    "--metric", metavar="NAME", help="The result key plotted (default: an Optuna sweep's metric)."
)
@click.option("--by", metavar="NAME", help="One series per value of this parameter.")
@click.option("-o", "--output", metavar="FILE.png", help="Default: <sweep folder>/plot-M-X.png.")
@click.option("--data", metavar="FILE.csv", help="Also write the plotted numbers as CSV.")
@click.option("--size", metavar="WxH", help="The PNG's size in pixels (default 800x500).")
@click.option("--logx", is_flag=True, help="A logarithmic x axis.")
@click.option("--history", is_flag=True, help="The metric per point and the best so far.")
@click.option("--text", "as_text", is_flag=True, help="An aligned table on stdout, no PNG.")
@click.option(
    "--direction",
    type=click.Choice(["minimize", "maximize"]),
    default=None,
    help="History: what best means (default: the sweep's, else minimize).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: the plotted series and the PNG written (null without one).",
)
@all_projects_flag
def plot_cmd(
    sweep: str,
    x: Optional[str],
    metric: Optional[str],
    by: Optional[str],
    output: Optional[str],
    data: Optional[str],
    size: Optional[str],
    logx: bool,
    history: bool,
    as_text: bool,
    direction: Optional[str],
    as_json: bool,
) -> int:
    """A metric of SWEEP's completed points against the parameter --x: the mean and
    sample standard deviation (n-1) of the points that share an x (repeats over seed),
    one series per value of --by. Optuna sweeps default to the optimisation history.
    A PNG needs matplotlib (pip install 'hpclaunch[plot]'); without it, a text table."""
    from hpclaunch.backends import sweepstate
    from hpclaunch.cli.common import find_sweep_dir
    from hpclaunch.sweeps import plot

    folder = find_sweep_dir(sweep)
    found = sweepstate.refresh(folder)
    rows = [sweepstate.point_row(found, r) for r in found.points]
    req = plot.PlotRequest(x, metric, by, output, data, size, logx, history, as_text, direction)
    return plot.run(folder, found.data, rows, req, as_json)


__all__ = ["json", "sweep_group"]
