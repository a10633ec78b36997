"""The run record: run.json as typed data, with the job's own events folded in.

Only the host side writes run.json (atomically, under a lock (locking.py), so that a `status` in one
terminal and a `--wait` in another never lose each other's changes). Code inside jobs
never imports this module: it appends events (rank start/end, staging) to events.jsonl
in the run folder, and `load` folds them in when it reads. Records written by hpclaunch
0.1.0 load unchanged; keys this version does not know are kept.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from hpclaunch.basics import filemodes
from hpclaunch.basics.states import State
from hpclaunch.config.jobspec import MASK, is_secret
from hpclaunch.config.secretnames import masked, names_in
from hpclaunch.errors import HpclaunchError
from hpclaunch.node import EVENTS, INPUT_BOUND
from hpclaunch.records import pointrecords
from hpclaunch.records.attempts import Attempt, fold
from hpclaunch.records.badnodes import BadNodes
from hpclaunch.records.badnodes import fold as fold_bad_nodes
from hpclaunch.records.locking import exclusive
from hpclaunch.records.runpaths import RECORD


@dataclass
class RankEvents:
    """What the ranks reported through events.jsonl."""

    started: dict[int, str] = field(default_factory=dict)  # rank -> node
    returncodes: dict[int, int] = field(default_factory=dict)
    first_start: Optional[float] = None
    last_end: Optional[float] = None
    first_failure: Optional[tuple[int, int]] = None  # (rank, returncode), earliest end
    staged_nodes: tuple[str, ...] = ()
    # --requeue: every attempt; the rank fields above are the last attempt's.
    attempts: list[Attempt] = field(default_factory=list)
    # The GPU watch's input-bound warnings (a node's first verdict), oldest first.
    warnings: list[str] = field(default_factory=list)
    # A batch script's --setup line failed with this exit code (no rank started).
    setup_failed: Optional[int] = None
    bad_nodes: BadNodes = field(default_factory=BadNodes)  # --preflight/--spares

    @property
    def nodes(self) -> list[str]:
        return sorted(set(self.started.values()))


@dataclass
class RunRecord:
    run_id: str
    run_dir: str
    exp: str = "default"
    cluster: str = ""
    backend: str = ""
    state: str = State.CREATED.value
    job_id: Optional[str] = None
    job_ids: list[str] = field(default_factory=list)
    exit_code: Optional[int] = None
    reason: str = ""
    submitted_at: Optional[float] = None
    ended_at: Optional[float] = None
    checkpoint_dir: str = ""
    command: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    cwd: str = ""
    code: dict[str, Any] = field(default_factory=dict)
    git: dict[str, Any] = field(default_factory=dict)
    hpclaunch_version: str = ""
    nodes: Optional[int] = None
    tasks_per_node: Optional[int] = None
    launcher: str = ""
    job_name: str = ""
    step: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # keys of other versions, kept
    events: RankEvents = field(default_factory=RankEvents)  # folded in, never written

    @property
    def path(self) -> Path:
        return Path(self.run_dir)

    @property
    def launcher_pid(self) -> Optional[int]:
        """The hpclaunch process supervising a local run (backends/local.py)."""
        pid = self.extra.get("launcher_pid")
        return pid if isinstance(pid, int) and not isinstance(pid, bool) else None

    @property
    def launcher_started(self) -> Optional[float]:
        started = self.extra.get("launcher_started")
        if isinstance(started, bool) or not isinstance(started, (int, float)):
            return None
        return float(started)

    @property
    def pgids(self) -> list[int]:
        """A local run's task process groups."""
        found = self.extra.get("pgids")
        return [g for g in found if isinstance(g, int)] if isinstance(found, list) else []

    @property
    def world_size(self) -> Optional[int]:
        return self.nodes * self.tasks_per_node if self.nodes and self.tasks_per_node else None

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON data; a requeued run's attempts folded in (never stored)."""
        data = {k: v for k, v in asdict(self).items() if k not in ("extra", "events")}
        tried = self.events.attempts
        if tried:
            data["attempts"] = [a.to_dict(a is tried[-1]) for a in tried]
        if self.events.warnings:
            data["warnings"] = list(self.events.warnings)
        data.update(self.events.bad_nodes.to_dict())
        return {**self.extra, **data}


_FIELDS = {f.name: f for f in fields(RunRecord) if f.name not in ("extra", "events")}


def _default(name: str) -> Any:
    f = _FIELDS[name]
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _typed(name: str, value: Any) -> Any:
    """A stored value in the field's type; the field's default when it is foreign."""
    kind = str(_FIELDS[name].type)
    optional = kind.startswith("Optional")
    if value is None:
        return None if optional else _default(name)
    if "int" in kind:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return int(value) if str(value).lstrip("-").isdigit() else _default(name)
    if "float" in kind:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok else _default(name)
    if "str" in kind and "[" not in kind.replace("Optional[str]", ""):
        return str(value)
    if kind == "bool":
        return value is True or value == "true"
    if kind.startswith("list"):
        return [str(v) for v in value] if isinstance(value, list) else _default(name)
    if kind.startswith("dict"):
        return dict(value) if isinstance(value, dict) else _default(name)
    return value


def from_dict(data: dict[str, Any], run_dir: Path) -> RunRecord:
    known = {k: _typed(k, v) for k, v in data.items() if k in _FIELDS}
    known["run_id"] = str(data.get("run_id") or run_dir.name)
    known["run_dir"] = str(data.get("run_dir") or run_dir)
    extra = {k: v for k, v in data.items() if k not in _FIELDS}
    return RunRecord(**known, extra=extra)


class DamagedRecord(HpclaunchError):
    """run.json exists but is not a record (one line naming the file and the way out)."""


def read_raw(run_dir: Path) -> dict[str, Any]:
    """run.json as stored; a sweep point's made from sweep.json until its run.json is
    first written (records/pointrecords.py); {} when the run folder has none yet."""
    path = run_dir / RECORD
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:  # a sweep point's, until first changed: from sweep.json
        return pointrecords.from_sweep(run_dir) or {}
    except (OSError, ValueError) as exc:
        raise DamagedRecord(
            f"{path}: unreadable run record ({type(exc).__name__}). Remove the run folder "
            "or restore the file"
        ) from None
    if not isinstance(data, dict):
        raise DamagedRecord(
            f"{path}: not a run record (a JSON {type(data).__name__}, not an object). "
            "Remove the run folder or restore the file"
        )
    return data


def load(run_dir: Path) -> RunRecord:
    """The record with the job's events folded in."""
    record = from_dict(read_raw(run_dir), run_dir)
    record.events = read_events(run_dir)
    return record


def event_lines(run_dir: Path) -> Iterator[dict[str, Any]]:
    """events.jsonl's objects, oldest first; lines cut short or foreign are skipped."""
    try:
        lines = (run_dir / EVENTS).read_bytes().splitlines()
    except OSError:
        return
    for line in lines:
        try:
            event = json.loads(line.decode("utf-8"))
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


# A sweep point's array script notes its own start and end, per attempt ("job": "123_4").
JOB_START, JOB_END = "point_start", "point_end"


def job_event(run_dir: Path, kind: str, job: str) -> Optional[dict[str, Any]]:
    """The last `kind` event (JOB_START, JOB_END) of the attempt that ran as `job`."""
    found = None
    for event in event_lines(run_dir):
        if event.get("event") == kind and event.get("job") == job:
            found = event
    return found


def read_events(run_dir: Path) -> RankEvents:
    """Fold events.jsonl; lines that are cut short or foreign are skipped. Of a requeued
    run, the ranks' and the staging's events count for the last attempt only."""
    found = RankEvents()
    staged: set[str] = set()
    failures: list[tuple[float, int, int]] = []  # (end time, rank, returncode)
    events = []
    for event in event_lines(run_dir):
        try:
            kind, when = event["event"], float(event.get("time", 0.0))
        except (ValueError, KeyError, TypeError):
            continue
        events.append((kind, when, event))
    found.attempts = fold(event for _, _, event in events)
    found.bad_nodes = fold_bad_nodes(event for _, _, event in events)
    last = found.attempts[-1].number if found.attempts else None
    for kind, when, event in events:
        if last is not None and event.get("attempt", last) != last:
            continue
        if kind == "rank_start" and isinstance(event.get("rank"), int):
            found.started[event["rank"]] = str(event.get("node", ""))
            found.first_start = min(found.first_start or when, when)
        elif kind == "rank_end" and isinstance(event.get("rank"), int):
            rc = event.get("returncode")
            if not isinstance(rc, int):
                continue
            found.returncodes[event["rank"]] = rc
            found.last_end = max(found.last_end or when, when)
            if rc != 0:
                failures.append((when, event["rank"], rc))
        elif kind == "setup_failed" and isinstance(event.get("exit_code"), int):
            found.setup_failed = event["exit_code"]
        elif kind == "stage_ready":
            staged.add(str(event.get("node", "")))
        elif kind == INPUT_BOUND and str(event.get("message", "")) not in found.warnings:
            found.warnings.append(str(event.get("message", "")))
    found.staged_nodes = tuple(sorted(staged))
    if failures:  # nodes append in their own order: the earliest end wins, then the rank
        _, rank, rc = min(failures)
        found.first_failure = (rank, rc)
    return found


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomic: a crash or a full disk in the middle leaves the old content (write aside,
    then rename) and no file aside."""
    filemodes.write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _locked(run_dir: Path) -> contextlib.AbstractContextManager[None]:
    """One writer of run.json at a time (read-modify-write from several processes): an
    flock on the run folder itself, else a lock file beside the record (locking.py). A
    sweep point's folder is made first if its array task has not made it yet."""
    pointrecords.make_folder(run_dir)
    return exclusive(run_dir)


def create(run_dir: Path, data: dict[str, Any]) -> None:
    write_json(run_dir / RECORD, data)


def new_record(spec: Any, paths: Any, backend: str, **facts: Any) -> RunRecord:
    """A new run's record, a run's or a sweep point's: what every record says of its job
    (`spec` a JobSpec, `paths` its RunPaths), and `facts` (state, command, job ids,
    a point's sweep_id/point/params, ...)."""
    from hpclaunch.version import __version__

    data: dict[str, Any] = {
        "run_id": paths.run_id,
        "run_dir": str(paths.run_dir),
        "checkpoint_dir": str(paths.checkpoint_dir),
        "exp": spec.exp,
        "cluster": spec.cluster,
        "backend": backend,
        "submitted_at": time.time(),
        "nodes": spec.nodes,
        "tasks_per_node": spec.tasks_per_node,
        "launcher": spec.launcher,
        "job_name": spec.job_name,
        "hpclaunch_version": __version__,
        **facts,
    }
    return from_dict(data, Path(paths.run_dir))


def write_new(record: RunRecord, *, fresh_folder: bool = False) -> None:
    """The one writer of a new run.json (a run, a sweep point). `fresh_folder`: a folder
    made moments ago that nobody reads yet, written plainly (no rename, no fsync: a sweep
    writes thousands; its sweep.json, written last, is the commit point)."""
    data = record.to_dict()
    if not fresh_folder:
        write_json(record.path / RECORD, data)
        return
    # One line, no indent: json's C encoder (indent= falls back to the pure-Python one,
    # about a third of a 1,000-point submission); readers json.load it.
    text = json.dumps(data, sort_keys=True) + "\n"
    with open(record.path / RECORD, "w", encoding="utf-8", errors="surrogateescape") as fh:
        fh.write(text)


def update(run_dir: Path, **changes: Any) -> dict[str, Any]:
    """Change some keys of run.json; returns the whole stored record."""
    with _locked(run_dir):
        data = read_raw(run_dir)
        data.update(changes)
        write_json(run_dir / RECORD, data)
    return data


def update_with(
    run_dir: Path, decide: Callable[[dict[str, Any]], Optional[dict[str, Any]]]
) -> Optional[dict[str, Any]]:
    """Change run.json as `decide` says from what is stored now, under the lock (a
    claim or a cancel that must not cross another process's); None: left unchanged."""
    with _locked(run_dir):
        data = read_raw(run_dir)
        changes = decide(data)
        if changes is None:
            return None
        data.update(changes)
        write_json(run_dir / RECORD, data)
    return changes


def as_recorded(req: Any, secrets: list[tuple[str, str]]) -> dict[str, Any]:
    """A request's command, argv and options as run.json and sweep.json keep them:
    secret `--env` values masked, and any secret value (8 characters or more) found in
    an argument, a --setup line or another option shown as $NAME; `masked_secrets`
    names those, for `rerun` to take from the environment again."""
    given = {
        # What `rerun` needs: the options as given (secret values masked) and the folder.
        "command": list(req.program),
        "argv": masked_argv(list(req.argv)),
        "options": masked_options(req.options),
    }
    names = names_in(given, secrets)
    out: dict[str, Any] = masked(given, secrets)
    return {**out, "masked_secrets": names} if names else out


def masked_options(options: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key == "env" and isinstance(value, (list, tuple)):
            value = [
                f"{item.partition('=')[0]}={MASK}" if is_secret(item.partition("=")[0]) else item
                for item in value
            ]
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


def masked_argv(argv: list[str]) -> list[str]:
    """hpclaunch's own command line for the record, with secret `--env` values masked
    (the program's own arguments after `--` are kept: the job runs them anyway)."""
    out: list[str] = []
    value_next = False
    for index, arg in enumerate(argv):
        if arg == "--":
            return out + argv[index:]
        prefix = ""
        if value_next:
            text = arg
        elif arg.startswith("--env="):
            prefix, text = "--env=", arg[len("--env=") :]
        else:
            text = ""
        name, sep, _ = text.partition("=")
        out.append(f"{prefix}{name}={MASK}" if sep and is_secret(name) else arg)
        value_next = arg == "--env"
    return out
