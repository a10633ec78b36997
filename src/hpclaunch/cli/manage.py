"""`hpclaunch runs | status | logs | cancel`: find runs through the per-user index."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

import click

RUN_ARG_HELP = "RUN is a run id, a unique prefix of one, a Slurm job id, or `last`."
TERMINAL_LOCAL = {"COMPLETED", "FAILED", "CANCELLED"}


def _live_states(records: list[dict[str, Any]]) -> dict[str, str]:
    """One squeue call for every unfinished Slurm run in the list."""
    from ..backends.slurm import ACTIVE, _run
    from ..errors import SlurmError

    ids = [
        str(r["job_id"])
        for r in records
        if r.get("backend") == "slurm" and r.get("job_id") and r.get("state") in ACTIVE
    ]
    if not ids:
        return {}
    try:
        out = _run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T"], timeout=30)
    except SlurmError:
        return {}
    states = {}
    for line in out.splitlines():
        job, _, state = line.partition("|")
        states[job.strip()] = state.strip()
    return states


def _refresh(record: dict[str, Any], run_dir: Path, retries: int = 1) -> dict[str, Any]:
    """Bring a Slurm run's record up to date (state, and exit code once it ended)."""
    from .. import runs
    from ..backends.slurm import ACTIVE, SlurmStatus
    from ..monitor import job_exit_code

    if record.get("backend") != "slurm" or not record.get("job_id"):
        return record
    if record.get("state") not in ACTIVE | {"CREATED"}:
        return record
    status = SlurmStatus(retries=retries).status(str(record["job_id"]))
    changes: dict[str, Any] = {"state": status.state, "reason": status.reason}
    if status.state not in ACTIVE and status.state != "UNKNOWN":
        changes["exit_code"] = job_exit_code(status.state, run_dir / "logs", status.exit_code)
    return runs.update_record(run_dir, **changes)


@click.command("runs")
@click.option("--exp", default=None, help="Only runs of this experiment.")
@click.option(
    "--state",
    default=None,
    help="Only runs in this state (e.g. RUNNING, FAILED), among the newest --limit.",
)
@click.option("-n", "--limit", default=20, show_default=True, help="How many runs to show.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def runs_cmd(exp: Optional[str], state: Optional[str], limit: int, as_json: bool) -> int:
    """List runs, newest first, from any directory."""
    from .. import runs

    entries = [e for e in runs.iter_live(runs.index_entries()) if not exp or e.get("exp") == exp]
    records = [{**e, **runs.read_record(Path(e["run_dir"]))} for e in entries[:limit]]
    live = _live_states(records)
    rows = []
    for rec in records:
        current = live.get(str(rec.get("job_id")))
        if current is None:
            # Not in the queue any more: bring its record up to date once (scontrol/sacct).
            rec = {
                **rec,
                **_refresh(runs.read_record(Path(rec["run_dir"])), Path(rec["run_dir"]), 0),
            }
            current = rec.get("state", "?")
        rows.append(
            {
                "run_id": rec["run_id"],
                "job_id": rec.get("job_id"),
                "cluster": rec.get("cluster"),
                "state": current,
                "exit_code": rec.get("exit_code"),
                "exp": rec.get("exp"),
                "run_dir": rec["run_dir"],
            }
        )
    if state:
        rows = [row for row in rows if str(row["state"]).upper() == state.upper()]
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return 0
    if not rows:
        click.echo("no runs yet: start one with hpclaunch run", err=True)
        return 0
    header = ("RUN", "JOB", "CLUSTER", "STATE", "EXIT", "EXP", "DIRECTORY")
    table = [header] + [
        tuple(
            "" if row[k] is None else str(row[k])
            for k in ("run_id", "job_id", "cluster", "state", "exit_code", "exp", "run_dir")
        )
        for row in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    for line in table:
        click.echo("  ".join([*(c.ljust(w) for c, w in zip(line, widths)), line[-1]]))
    return 0


@click.command("status", epilog=RUN_ARG_HELP)
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="Print the run record as JSON.")
def status_cmd(run: str, as_json: bool) -> int:
    """Show a run's state, job id, exit code and where it lives."""
    from .. import runs

    entry = runs.find(run)
    run_dir = Path(entry["run_dir"])
    record = _refresh(runs.read_record(run_dir), run_dir)
    if as_json:
        click.echo(json.dumps(record, indent=2, sort_keys=True))
        return 0
    state = record.get("state", "?")
    if record.get("reason"):
        state += f" ({record['reason']})"
    for key, value in (
        ("run", record.get("run_id")),
        ("job", record.get("job_id")),
        ("cluster", record.get("cluster")),
        ("state", state),
        ("exit code", record.get("exit_code")),
        ("ranks", _ranks(record)),
        ("directory", str(run_dir)),
        ("logs", str(run_dir / "logs")),
    ):
        if value not in (None, ""):
            click.echo(f"{key:10} {value}")
    return 0


def _ranks(record: dict[str, Any]) -> str:
    nodes, tasks = record.get("nodes"), record.get("tasks_per_node")
    return f"{nodes} node(s) x {tasks}" if nodes and tasks else ""


@click.command("show", epilog=RUN_ARG_HELP)
@click.argument("run")
def show_cmd(run: str) -> int:
    """Print a run's whole record: run.json, spec.json, the batch script and the diff."""
    from .. import runs

    run_dir = Path(runs.find(run)["run_dir"])
    record = _refresh(runs.read_record(run_dir), run_dir)
    click.echo(json.dumps(record, indent=2, sort_keys=True))
    for name in ("spec.json", "job.sh", "git.diff"):
        path = run_dir / name
        if path.is_file():
            click.echo(f"\n# {path}")
            click.echo(path.read_text(encoding="utf-8", errors="replace").rstrip("\n"))
    return 0


@click.command("logs", epilog=RUN_ARG_HELP)
@click.argument("run")
@click.option("--rank", type=int, default=None, help="Only this rank's output.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@click.option("--no-tag", is_flag=True, help="Print lines without the [node rank] prefix.")
def logs_cmd(run: str, rank: Optional[int], follow: bool, no_tag: bool) -> int:
    """Print a run's output, each line tagged [node rank]; stderr lines go to stderr."""
    from .. import runs
    from ..backends.slurm import ACTIVE
    from ..errors import UserError
    from ..logs import LogFollower

    entry = runs.find(run)
    run_dir = Path(entry["run_dir"])
    if rank is not None and rank < 0:
        raise UserError("--rank", f"{rank}", "at least 0", "Give a rank number such as 0")
    follower = LogFollower(
        run_dir / "logs",
        sys.stdout,
        sys.stderr,
        rank=rank,
        include_batch=rank is None,
        tag=not no_tag,
    )
    follower.poll()
    if not follow:
        follower.drain()
        return 0
    record = runs.read_record(run_dir)
    try:
        last_check = 0.0
        while True:
            follower.poll()
            if time.monotonic() - last_check > 2.0:
                last_check = time.monotonic()
                record = _refresh(runs.read_record(run_dir), run_dir)
                if record.get("backend") == "local" and record.get("state") in TERMINAL_LOCAL:
                    break
                if record.get("backend") == "slurm" and record.get("state") not in ACTIVE | {
                    "CREATED"
                }:
                    break
            time.sleep(0.25)
    except KeyboardInterrupt:
        pass
    time.sleep(0.3)
    follower.drain()
    return 0


@click.command("cancel", epilog=RUN_ARG_HELP)
@click.argument("run")
def cancel_cmd(run: str) -> int:
    """Cancel a run's Slurm job (scancel)."""
    from .. import runs
    from ..backends import slurm
    from ..errors import UserError

    entry = runs.find(run)
    record = runs.read_record(Path(entry["run_dir"]))
    if record.get("backend") != "slurm" or not record.get("job_id"):
        raise UserError(
            "RUN",
            f"{record.get('run_id')} is a local run",
            "",
            "Local runs end with Ctrl-C in their terminal",
        )
    if record.get("step"):
        raise UserError(
            "RUN",
            f"{record.get('run_id')} ran as a step of job {record['job_id']}",
            "cancelling would end the whole allocation",
            "Press Ctrl-C in its terminal, or scancel the step yourself",
        )
    slurm.cancel(str(record["job_id"]))
    click.echo(f"cancelled job {record['job_id']} (run {record.get('run_id')})")
    return 0
