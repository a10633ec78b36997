"""`hpclaunch runs | status | show`: recorded runs, brought up to date in one call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import click

from hpclaunch.cli.common import (
    RUN_OR_LAST,
    all_projects_option,
    coloured_states,
    environ,
    find_run_dir,
    warn,
)

_COLUMNS = ("run_id", "job_id", "cluster", "state", "exit_code", "exp", "name", "run_dir")
_HEADER = ("RUN", "JOB", "CLUSTER", "STATE", "EXIT", "EXP", "NAME", "DIRECTORY")
_NAME_WIDTH = 30  # the NAME column: a job name or the command, cut to this


@click.command("runs")
@click.option("--exp", default=None, help="Only runs of this experiment.")
@click.option(
    "--state",
    default=None,
    help="Only runs in this state (e.g. RUNNING, FAILED), searched among every recorded run.",
)
@click.option("-n", "--limit", default=20, show_default=True, help="How many runs to show.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def runs_cmd(exp: Optional[str], state: Optional[str], limit: int, as_json: bool) -> int:
    """List runs and sweeps, newest first, from any directory (one squeue and at most one
    sacct call for all of them); says how many older ones the list leaves out."""
    rows, older = _listing(environ(), exp, state, limit)
    if older:
        click.echo(f"hpclaunch: {older} older runs not listed: -n {limit + older}", err=True)
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return 0
    if not rows:
        click.echo(_nothing_listed(exp, state), err=True)
        return 0
    table = [_HEADER] + [tuple(_cell(row, k) for k in _COLUMNS) for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(_HEADER) - 1)]
    state_at = _COLUMNS.index("state")
    for number, line in enumerate(table):
        cells = [c.ljust(w) for c, w in zip(line, widths)]
        if number:  # the header stays plain
            cells[state_at] = coloured_states(cells[state_at])
        click.echo("  ".join([*cells, line[-1]]))
    return 0


def _cell(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    text = "" if value is None else str(value)
    return text[: _NAME_WIDTH - 3] + "..." if key == "name" and len(text) > _NAME_WIDTH else text


def _nothing_listed(exp: Optional[str], state: Optional[str]) -> str:
    """Why the list is empty: no runs at all, none in that experiment, none in that state."""
    if exp and state:
        return f"no {state.upper()} runs in experiment {exp!r}: see hpclaunch runs --exp {exp}"
    if exp:
        return f"no runs in experiment {exp!r}: see hpclaunch runs for every experiment"
    if state:
        return f"no {state.upper()} runs: see hpclaunch runs"
    return "no runs yet: start one with hpclaunch run"


def _listing(
    env: dict[str, str], exp: Optional[str], state: Optional[str], limit: int
) -> tuple[list[dict[str, Any]], int]:
    """The newest `limit` runs and sweeps (of `exp`; of every recorded one in `state`) as
    rows, newest first, and how many more matched: the runs and the open sweeps' points
    brought up to date together (track.refresh_with_runs: one squeue, at most one sacct).
    A sweep is one line: its array job ids and its points' counts per state. An ended
    sweep's line comes from the tally kept in its sweep.json when it was first seen
    ended, so that its points' records are not read again (10 ended sweeps of 1,000
    points are 10,000 files). A damaged record is skipped (said), never the end."""
    from hpclaunch.api import check_state
    from hpclaunch.records import index

    wanted = check_state(state) if state else None
    entries = [e for e in index.live(env, warn) if not exp or e.get("exp") == exp]
    # Without --state the newest `limit` lines are the rows; with it, every run is read
    # (an ended run's record, no Slurm call) and the state picks among them.
    chosen = entries if wanted else entries[:limit]
    rows = _rows(chosen, wanted)
    rows.sort(key=lambda r: str(r["run_id"]), reverse=True)  # ids sort by time
    older = (len(rows) if wanted else len(entries)) - limit
    return rows[:limit], max(older, 0)


def _rows(entries: list[dict[str, Any]], wanted: Optional[str]) -> list[dict[str, Any]]:
    from hpclaunch.backends import sweepstate
    from hpclaunch.records import runrecord, sweeprecord
    from hpclaunch.sweeps import ops

    plain: list[runrecord.RunRecord] = []
    for entry in [e for e in entries if not e.get("sweep")]:
        try:
            plain.append(runrecord.load(Path(entry["run_dir"])))
        except runrecord.DamagedRecord as exc:
            warn(str(exc))
    rows, still_open = [], []
    for folder in _sweep_folders([e for e in entries if e.get("sweep")]):
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
    rows = [r for r in rows if not wanted or wanted in r["counts"]]
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
        "name": _name("", data.get("command")),
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
        "name": _name(rec.job_name, rec.command),
        "run_dir": rec.run_dir,
    }


def _name(job_name: str, command: Any) -> str:
    """The NAME column: a --job-name given (one that is not the name hpclaunch derives
    from the command), else the command as typed, on one line."""
    from hpclaunch.planning.validate import default_job_name

    words = [str(word) for word in command] if isinstance(command, list) else []
    if job_name and (not words or job_name != default_job_name(tuple(words))):
        words = [job_name]
    return " ".join(" ".join(word.split()) for word in words)


@click.command("status", epilog=RUN_OR_LAST)
@click.argument("run", default="last")
@click.option("--json", "as_json", is_flag=True, help="Print the run record as JSON.")
@all_projects_option
def status_cmd(run: str, as_json: bool, all_projects: bool) -> int:
    """Show a run's state, job id, exit code and where it lives."""
    from hpclaunch.backends import runstatus
    from hpclaunch.basics import states
    from hpclaunch.cli.reporting import summary
    from hpclaunch.records.attempts import summary as attempt_lines

    run_dir = find_run_dir(run, all_projects)
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
            click.echo(f"{key:10} {coloured_states(str(value)) if key == 'state' else value}")
    for line in attempt_lines(record.events.attempts):
        click.echo(f"{'':10} {line}")
    for line in record.events.bad_nodes.lines():  # --preflight/--spares
        click.echo(line)
    for warning in record.events.warnings:  # the GPU watch's: input-bound
        click.echo(f"{'warning':10} {warning}")
    if not states.is_open(record.state):
        click.echo(f"{'summary':10} {summary(record)}")
    return 0


@click.command("show", epilog=RUN_OR_LAST)
@click.argument("run", default="last")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: record and files.")
@all_projects_option
def show_cmd(run: str, as_json: bool, all_projects: bool) -> int:
    """Print a run's whole record: run.json, spec.json, the batch script and the diff."""
    from hpclaunch.backends import runstatus
    from hpclaunch.config.secretnames import mask_text

    run_dir = find_run_dir(run, all_projects)
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
