"""`hpclaunch runs | status | show`: recorded runs, brought up to date in one call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import click

from hpclaunch.cli.common import RUN_ARG_HELP, environ, find_run_dir, warn

_COLUMNS = ("run_id", "job_id", "cluster", "state", "exit_code", "exp", "run_dir")
_HEADER = ("RUN", "JOB", "CLUSTER", "STATE", "EXIT", "EXP", "DIRECTORY")


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
    """List runs and sweeps, newest first, from any directory (one squeue and at most one
    sacct call for all of them)."""
    rows = _listing(environ(), exp, state, limit)
    rows.sort(key=lambda r: str(r["run_id"]), reverse=True)  # ids sort by time
    rows = rows[:limit]
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return 0
    if not rows:
        click.echo("no runs yet: start one with hpclaunch run", err=True)
        return 0
    table = [_HEADER] + [
        tuple("" if row[k] is None else str(row[k]) for k in _COLUMNS) for row in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(_HEADER) - 1)]
    for line in table:
        click.echo("  ".join([*(c.ljust(w) for c, w in zip(line, widths)), line[-1]]))
    return 0


def _listing(
    env: dict[str, str], exp: Optional[str], state: Optional[str], limit: int
) -> list[dict[str, Any]]:
    """The newest `limit` runs and `limit` sweeps (of `exp`) as rows: the runs and the
    open sweeps' points brought up to date together (track.refresh_with_runs: one squeue,
    at most one sacct). A sweep is one line: its array job ids and its points' counts per
    state. An ended sweep's line comes from the tally kept in its sweep.json when it was
    first seen ended, so that its points' records are not read again (10 ended sweeps of
    1,000 points are 10,000 files). A damaged record is skipped (said), never the end."""
    from hpclaunch.api import check_state
    from hpclaunch.backends import sweepstate
    from hpclaunch.records import index, runrecord, sweeprecord
    from hpclaunch.sweeps import ops

    wanted = check_state(state) if state else None
    entries = [e for e in index.live(env, warn) if not exp or e.get("exp") == exp]
    plain: list[runrecord.RunRecord] = []
    for entry in [e for e in entries if not e.get("sweep")][:limit]:
        try:
            plain.append(runrecord.load(Path(entry["run_dir"])))
        except runrecord.DamagedRecord as exc:
            warn(str(exc))
    rows, still_open = [], []
    for folder in _sweep_folders([e for e in entries if e.get("sweep")][:limit]):
        data = sweeprecord.load(folder)
        tally = _ended_tally(data)
        if tally is None:
            still_open.append(sweepstate.load(folder))
        else:
            rows.append(_sweep_row(data, tally["counts"], tally["exit_code"]))
    found = sweepstate.refresh_with_runs(still_open, plain)
    for sweep in still_open:
        counts = sweep.counts()
        code = None if sweep.active() else ops.exit_code(sweep)
        if code is not None:
            sweep.data = _keep_tally(sweep.sweep_dir, sweep.data, counts, code)
        rows.append(_sweep_row(sweep.data, counts, code))
    rows = [r for r in rows if not state or state.upper() in r["counts"]]
    return [*(_row(r) for r in found if wanted is None or r.state == wanted), *rows]


def _sweep_folders(entries: list[dict[str, Any]]) -> list[Path]:
    from hpclaunch.records import sweeprecord

    folders = []
    for entry in entries:
        try:
            folder = Path(entry["run_dir"])
        except (KeyError, TypeError):
            continue
        if sweeprecord.is_sweep(folder):
            folders.append(folder)
    return folders


def _array_ids(data: dict[str, Any]) -> list[str]:
    return [str(a.get("job_id")) for a in data.get("arrays") or [] if isinstance(a, dict)]


def _ended_tally(data: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The tally of an ended sweep, unless arrays were submitted since (`sweep retry`
    re-opens a sweep by adding arrays: its tally no longer holds)."""
    from hpclaunch.records.sweeprecord import ENDED_TALLY

    tally = data.get(ENDED_TALLY)
    if not isinstance(tally, dict) or tally.get("arrays") != _array_ids(data):
        return None
    counts, code = tally.get("counts"), tally.get("exit_code")
    if not isinstance(counts, dict) or not isinstance(code, int):
        return None
    return tally


def _keep_tally(
    sweep_dir: Path, data: dict[str, Any], counts: dict[str, int], code: int
) -> dict[str, Any]:
    """Written once, when a listing first sees the sweep ended (no point pending or
    running); a folder that cannot be written is listed the slow way next time."""
    from hpclaunch.records import sweeprecord

    tally = {"counts": counts, "exit_code": code, "arrays": _array_ids(data)}
    try:
        return sweeprecord.update(sweep_dir, **{sweeprecord.ENDED_TALLY: tally})
    except OSError:
        return data


def _sweep_row(data: dict[str, Any], counts: dict[str, int], code: Optional[int]) -> dict[str, Any]:
    arrays = ",".join(_array_ids(data))
    return {
        "run_id": str(data["sweep_id"]),
        "job_id": arrays or None,
        "cluster": data.get("cluster"),
        "state": " ".join(f"{n} {s}" for s, n in sorted(counts.items())),
        "exit_code": code,
        "exp": data.get("exp"),
        "run_dir": str(Path(data["sweep_dir"])),
        "sweep": True,
        "points": len(data["points"]),
        "counts": counts,
    }


def _row(rec: Any) -> dict[str, Any]:
    return {
        "run_id": rec.run_id,
        "job_id": rec.job_id,
        "cluster": rec.cluster,
        "state": rec.state,
        "exit_code": rec.exit_code,
        "exp": rec.exp,
        "run_dir": rec.run_dir,
    }


@click.command("status", epilog=RUN_ARG_HELP)
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="Print the run record as JSON.")
def status_cmd(run: str, as_json: bool) -> int:
    """Show a run's state, job id, exit code and where it lives."""
    from hpclaunch.backends import runstatus
    from hpclaunch.basics import states
    from hpclaunch.cli.reporting import summary
    from hpclaunch.records.attempts import summary as attempt_lines

    run_dir = find_run_dir(run)
    record = runstatus.refresh_one(run_dir)
    if as_json:
        data = record.to_dict()
        if not states.is_open(record.state):
            data["summary"] = summary(record)  # which rank failed first, attempts, ...
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return 0
    state = record.state + (f" ({record.reason})" if record.reason else "")
    ranks = f"{record.nodes} node(s) x {record.tasks_per_node}" if record.world_size else ""
    for key, value in (
        ("run", record.run_id),
        ("job", record.job_id),
        ("cluster", record.cluster),
        ("state", state),
        ("exit code", record.exit_code),
        ("ranks", ranks),
        ("directory", str(run_dir)),
        ("logs", str(run_dir / "logs")),
        ("attempts", len(record.events.attempts) or None),
    ):
        if value not in (None, ""):
            click.echo(f"{key:10} {value}")
    for line in attempt_lines(record.events.attempts):
        click.echo(f"{'':10} {line}")
    for warning in record.events.warnings:  # the GPU watch's: input-bound
        click.echo(f"{'warning':10} {warning}")
    if not states.is_open(record.state):
        click.echo(f"{'summary':10} {summary(record)}")
    return 0


@click.command("show", epilog=RUN_ARG_HELP)
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: record and files.")
def show_cmd(run: str, as_json: bool) -> int:
    """Print a run's whole record: run.json, spec.json, the batch script and the diff."""
    from hpclaunch.backends import runstatus
    from hpclaunch.config.secretnames import mask_text

    run_dir = find_run_dir(run)
    record = runstatus.refresh_one(run_dir).to_dict()
    # job.sh holds the program's arguments as typed: a secret's value among them is shown
    # as $NAME, as the record has it (the value from this environment, where it is set).
    env = environ()
    hidden = [(str(n), env[str(n)]) for n in record.get("masked_secrets") or () if str(n) in env]
    files = {}
    for name in ("spec.json", "job.sh", "git.diff"):
        path = run_dir / name
        if path.is_file():
            files[name] = mask_text(path.read_text(encoding="utf-8", errors="replace"), hidden)
    if as_json:
        click.echo(json.dumps({"record": record, "files": files}, indent=2, sort_keys=True))
        return 0
    # For a person: every section named, times as local dates (--json keeps seconds).
    click.echo(f"==> record: {run_dir / 'run.json'} (times in local time) <==")
    click.echo(json.dumps(_dated(record), indent=2, sort_keys=True))
    for name, text in files.items():
        click.echo(f"\n==> {_SECTIONS.get(name, name)}: {run_dir / name} <==")
        click.echo(text.rstrip("\n"))
    return 0


_SECTIONS = {"spec.json": "spec", "job.sh": "batch script", "git.diff": "code changes"}


def _dated(value: Any, key: str = "") -> Any:
    """A record with its times (`*_at`: seconds since the epoch) as ISO local dates."""
    from datetime import datetime

    if isinstance(value, dict):
        return {k: _dated(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_dated(v, key) for v in value]
    if key.endswith("_at") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value).astimezone().isoformat(timespec="seconds")
    return value
