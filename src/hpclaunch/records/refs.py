"""What a user types to name a run, a sweep or a sweep's point, resolved to its folder:
the one reader of RUN, SWEEP and SWEEP:I for every command and the API.

- RUN: a run id, a unique prefix of one, a Slurm job id (any member of a --chain), a
  Slurm array task (`ARRAY_TASK`: that sweep point), a run folder, or `last`.
- SWEEP: a sweep id, a unique prefix, an array job id, a sweep folder, or `last`.
- SWEEP:I: point I of that sweep (a run folder like any other).
- `last`: this project's newest run or sweep started (the index's newest line of the
  project: the git work tree holding the current folder, else that folder; over
  --remote, the shipped project's), or anyone's with all_projects (--all-projects).
  Where one run is needed (logs, status, show, ...) a sweep gives its most recently
  started point; `cancel` and `--after` take the whole sweep; SWEEP commands the newest
  sweep.

A path is told from an id by its `/` (ids never hold one), or is `.`, `..` or a run or
sweep folder in the current one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpclaunch.errors import UserError, show
from hpclaunch.records import index
from hpclaunch.records import sweeprecord as sweep_record
from hpclaunch.records.index import Warn

Entry = dict[str, Any]
RUN_FORMS = "a run id, a unique prefix, a job id or last"
SWEEP_FORMS = "a sweep id, a unique prefix, an array job id or last"


@dataclass(frozen=True)
class Found:
    """A run's folder (run.json; a point is a run) or a sweep's (sweep.json)."""

    folder: Path
    is_sweep: bool


def run_dir(
    ref: str,
    environ: Mapping[str, str],
    warn: Optional[Warn] = None,
    all_projects: bool = False,
) -> Path:
    """RUN -> its run folder; `last` naming a sweep gives its most recently started point."""
    if ref == "last":
        found = run_or_sweep(ref, environ, warn, all_projects)
    else:
        found = _run(ref, environ, warn)
    return newest_point(found.folder) if found.is_sweep else found.folder


def run_or_sweep(
    ref: str,
    environ: Mapping[str, str],
    warn: Optional[Warn] = None,
    all_projects: bool = False,
) -> Found:
    """RUN or SWEEP (for `cancel`, `--after`): `last` is the newest of either; else a run
    where one matches (a run's rules first), then a sweep (a sweep's rules)."""
    if _is_path(ref):
        return _folder(ref, "RUN")
    every = index.live(environ, warn)
    if ref == "last":
        return _found(_last(every, environ, all_projects, "RUN"))
    exact = [e for e in every if e["run_id"] == ref]
    if exact:
        return _found(exact[0])
    try:
        return _run(ref, environ, warn, every)
    except UserError:
        sweeps = [e for e in every if e.get("sweep")]
        if ":" in ref or not any(
            e["run_id"].startswith(ref) or ref in _array_ids(e) for e in sweeps
        ):
            raise
    return Found(sweep_dir(ref, environ), True)


def sweep_dir(ref: str, environ: Mapping[str, str], all_projects: bool = False) -> Path:
    """SWEEP = a sweep id, a unique prefix, an array job id, a folder, or `last` (this
    project's newest sweep)."""
    if _is_path(ref):
        found = _folder(ref, "SWEEP")
        if not found.is_sweep:
            raise UserError(
                "SWEEP", f"{show(ref)} is a run, not a sweep", SWEEP_FORMS, "See hpclaunch runs"
            )
        return found.folder
    entries = [e for e in index.live(environ) if e.get("sweep")]
    if not entries:
        raise UserError(
            "SWEEP", f"no sweeps recorded yet ({show(ref)})", "", "Start one with hpclaunch sweep"
        )
    if ref == "last":
        return Path(_last(entries, environ, all_projects, "SWEEP")["run_dir"])
    for match in (
        [e for e in entries if e["run_id"] == ref],
        [e for e in entries if ref in _array_ids(e)],
        [e for e in entries if e["run_id"].startswith(ref)],
    ):
        if len(match) == 1:
            return Path(match[0]["run_dir"])
        if len(match) > 1:
            raise UserError(
                "SWEEP",
                f"{show(ref)} matches {len(match)} sweeps",
                "the prefix must be unique",
                f"Type more of it, e.g. {match[0]['run_id']}",
            )
    raise UserError("SWEEP", f"no sweep matches {show(ref)}", SWEEP_FORMS, "See hpclaunch runs")


def point_dir(ref: str, environ: Mapping[str, str]) -> Path:
    """SWEEP:INDEX -> that point's run folder."""
    sweep_ref, _, index_text = ref.rpartition(":")
    folder = sweep_dir(sweep_ref, environ)
    data = sweep_record.load(folder)
    if not index_text.isdigit() or int(index_text) >= len(data["points"]):
        raise UserError(
            "RUN",
            f"{show(ref)} names no point of sweep {data['sweep_id']}",
            f"points 0-{len(data['points']) - 1}",
            "",
        )
    return sweep_record.point_dir(folder, int(index_text))


def newest_point(sweep_folder: Path) -> Path:
    """The sweep's most recently started point (points start in index order), else point 0."""
    total = len(sweep_record.load(sweep_folder)["points"])
    for number in range(total - 1, 0, -1):
        folder = sweep_record.point_dir(sweep_folder, number)
        if (folder / "events.jsonl").exists():
            return folder
    return sweep_record.point_dir(sweep_folder, 0)


def sweep_of(folder: Path) -> Optional[tuple[Path, int]]:
    """A point's run folder -> (its sweep's folder, its index); None for a plain run."""
    sweep_folder = folder.parent.parent
    if folder.parent.name != sweep_record.POINTS or not folder.name.isdigit():
        return None
    return (sweep_folder, int(folder.name)) if sweep_record.is_sweep(sweep_folder) else None


def _last(
    entries: list[Entry], environ: Mapping[str, str], all_projects: bool, field: str
) -> Entry:
    """The newest of entries (newest first) started in this project, or anyone's."""
    what = "run or sweep" if field == "RUN" else "sweep"
    if not entries:  # the words of _run_entry's and sweep_dir's refusals
        raise UserError(
            field, f"no {field.lower()}s recorded yet ('last')", "", "Start one with hpclaunch run"
        )
    here = index.project_of(Path.cwd(), environ)
    if all_projects or here == index.ANY_PROJECT:
        return entries[0]
    for entry in entries:
        if index.entry_project(entry, environ) == here:
            return entry
    raise UserError(
        field,
        f"no {what} started in this project ({here})",
        "last is this project's newest",
        "Give its id (see hpclaunch runs); status, logs, show and cancel take --all-projects",
    )


def _run_entry(ref: str, every: list[Entry]) -> Entry:
    sweeps = [e for e in every if e.get("sweep") and e["run_id"].startswith(ref)]
    entries = [e for e in every if not e.get("sweep")]  # a sweep is no run; its points are
    if not entries and sweeps and ref != "last":
        raise _a_sweep(ref, sweeps[0]["run_id"])
    if not entries:
        raise UserError(
            "RUN", f"no runs recorded yet ({show(ref)})", "", "Start one with hpclaunch run"
        )
    if ref == "last":
        return entries[0]
    exact = [e for e in entries if e["run_id"] == ref]
    if exact:
        return exact[0]
    # A --chain run's entry lists every member's job id: any of them names the run.
    by_job = [e for e in entries if e.get("job_id") == ref or ref in (e.get("job_ids") or ())]
    if len(by_job) == 1:
        return by_job[0]
    if len(by_job) > 1:
        ids = ", ".join(e["run_id"] for e in by_job[:5])
        raise UserError(
            "RUN",
            f"job id {show(ref)} belongs to {len(by_job)} runs ({ids})",
            "a job id must name one run",
            "Give the run id instead",
        )
    matches = [e for e in entries if e["run_id"].startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches and sweeps:
        raise _a_sweep(ref, sweeps[0]["run_id"])
    if not matches:
        raise UserError("RUN", f"no run matches {show(ref)}", RUN_FORMS, "See hpclaunch runs")
    raise UserError(
        "RUN",
        f"{show(ref)} matches {len(matches)} runs",
        "the prefix must be unique",
        f"Type more of it, e.g. {matches[0]['run_id']}",
    )


def _run(
    ref: str,
    environ: Mapping[str, str],
    warn: Optional[Warn] = None,
    every: Optional[list[Entry]] = None,
) -> Found:
    """RUN but `last`: a folder, SWEEP:I, an array task, or a run's index line."""
    if _is_path(ref):
        found = _folder(ref, "RUN")
        if found.is_sweep:
            raise _a_sweep(ref, found.folder.name)
        return found
    if ":" in ref:  # SWEEP:INDEX: a point of a sweep, a run folder like any other
        return Found(point_dir(ref, environ), False)
    every = index.live(environ, warn) if every is None else every
    array, sep, task = ref.partition("_")
    if sep and array.isdigit() and task.isdigit():
        point = _array_task(array, int(task), [e for e in every if e.get("sweep")])
        if point is not None:
            return Found(point, False)
    return Found(Path(_run_entry(ref, every)["run_dir"]), False)


def _array_task(array: str, task: int, sweeps: list[Entry]) -> Optional[Path]:
    """Slurm's ARRAY_TASK id of a sweep's point: the array's first point plus the task."""
    for entry in sweeps:
        for part in _arrays(entry):
            if str(part.get("job_id")) == array:
                folder = sweep_record.point_dir(Path(entry["run_dir"]), int(part["offset"]) + task)
                return folder if task < int(part.get("points", 0)) else None
    return None


def _is_path(ref: str) -> bool:
    """A folder's path, told from an id by its `/` (ids never hold one); SWEEP:I whose
    SWEEP is a path is a point unless the whole is a folder. Without a `/`: `.`, `..`,
    `~`, or a run or sweep folder here (inside a run folder, `hpclaunch logs .`)."""
    if "/" in ref:
        return ":" not in ref or Path(ref).expanduser().is_dir()
    if ref in (".", "..", "~"):
        return True
    folder = Path(ref)
    return (folder / "run.json").is_file() or sweep_record.is_sweep(folder)


def _folder(ref: str, field: str) -> Found:
    """A run or sweep folder named by its path (relative to here, or absolute)."""
    folder = Path(ref).expanduser().absolute()
    if sweep_record.is_sweep(folder):
        return Found(folder, True)
    if (folder / "run.json").is_file() or sweep_of(folder) is not None:  # a point: its
        return Found(folder, False)  # record is made from sweep.json until it first changes
    raise UserError(
        field,
        f"{show(ref)} is no run or sweep folder",
        "it holds no run.json or sweep.json",
        "Give a run or sweep id, or its folder (see hpclaunch runs)",
    )


def _found(entry: Entry) -> Found:
    return Found(Path(entry["run_dir"]), bool(entry.get("sweep")))


def _arrays(entry: Entry) -> list[dict[str, Any]]:
    try:
        data = sweep_record.load(Path(entry["run_dir"]))
    except sweep_record.DamagedSweep:
        return []
    return [a for a in data.get("arrays") or [] if isinstance(a, dict)]


def _array_ids(entry: Entry) -> list[str]:
    return [str(a["job_id"]) for a in _arrays(entry) if "job_id" in a]


def _a_sweep(ref: str, sweep_id: str) -> UserError:
    return UserError(
        "RUN",
        f"{show(ref)} is a sweep, not a run",
        "a point of it is SWEEP:INDEX",
        f"See hpclaunch sweep status {sweep_id}, or name a point: {sweep_id}:0",
    )
