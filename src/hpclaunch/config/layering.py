"""Configuration layers -> one JobSpec.

built-in profile < user profile < project hpclaunch.toml ([run], [clusters.NAME]; which
file, and whether it may be read: projectfile.py)
< environment (HPCLAUNCH_CLUSTER, HPCLAUNCH_CONFIG, SBATCH_ACCOUNT/PARTITION/RESERVATION)
< command line. Every value is converted to its type here, into one frozen RunOptions
(options.py): past this module options are typed attributes, never string keys. config
only layers: it never asks Slurm, packs data or looks inside images (planning/preparing.py does,
where a run starts).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hpclaunch.basics.units import parse_memory, parse_size, parse_time
from hpclaunch.config import projectfile
from hpclaunch.config.options import BY_NAME, RunOptions
from hpclaunch.config.projectfile import PROJECT_FILE
from hpclaunch.errors import UserError, show

# sbatch reads these itself; hpclaunch resolves them into the spec so the script shows them.
SBATCH_ENV = {
    "account": "SBATCH_ACCOUNT",
    "partition": "SBATCH_PARTITION",
    "reservation": "SBATCH_RESERVATION",
}


@dataclass(frozen=True)
class Layers:
    """Every option value the layers give, typed, and which layer gave it."""

    options: RunOptions
    sources: dict[str, str]  # option dest -> "cli", "project", "env:NAME"
    project_file: Optional[Path]
    project_run: dict[str, Any] = field(default_factory=dict)  # [run] as written
    project_clusters: dict[str, Any] = field(default_factory=dict)  # [clusters.NAME]
    project_warnings: tuple[str, ...] = ()  # project files ignored, hosts not taken, why

    @property
    def cluster(self) -> Optional[tuple[str, str]]:
        """(name, source) when a layer names the cluster; None: detect it."""
        if self.sources.get("cluster") == "cli" and self.options.cluster is not None:
            return self.options.cluster, "cli"
        return None


def find_project_file(cwd: Path, environ: Mapping[str, str]) -> Optional[Path]:
    """The project file a command here uses (projectfile.py: where it is looked for,
    and when it may be read)."""
    return projectfile.find(cwd, environ).path


def project_tables(cwd: Path, environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The project file's [run] and [clusters] tables (empty without a file)."""
    return tables_of(projectfile.find(cwd, environ))


SWEEP_KEYS = ("wandb_sweep",)  # [sweep] in hpclaunch.toml (read by sweeps/wandb.py)


def tables_of(found: projectfile.Found) -> tuple[dict[str, Any], dict[str, Any]]:
    """A found project file's [run] and [clusters], every key checked."""
    path, data = found.path, found.data
    if path is None:
        return {}, {}
    unknown = sorted(set(data) - {"run", "clusters", "sweep"})
    if unknown:
        raise UserError(
            f"{path}",
            f"unknown table {show(unknown[0])}",
            "known: [run], [sweep], [clusters.NAME]",
            "Remove or rename it",
        )
    for key in data.get("sweep", {}):
        if key not in SWEEP_KEYS:
            raise UserError(
                f"{path} [sweep] {key}",
                "unknown key",
                f"known: {', '.join(SWEEP_KEYS)}",
                "See hpclaunch sweep --help",
            )
    return _run_keys(data.get("run", {}), path), data.get("clusters", {})


def _run_keys(run: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """[run] with its keys spelled as the options' long names: `tasks_per_node` (as the
    API and [clusters.*] spell it) is `tasks-per-node`; one key in both spellings is
    refused rather than one silently winning."""
    named: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in run.items():
        name = key.replace("_", "-")
        if name not in BY_NAME:
            raise UserError(
                f"{path} [run] {key}",
                "unknown key",
                "keys are the long option names (dashes or underscores)",
                "See hpclaunch run --help",
            )
        if name in spelled:
            raise UserError(
                f"{path} [run] {key}",
                f"given twice, also as {spelled[name]}",
                "one spelling per key",
                f"Keep one of {spelled[name]} and {key}",
            )
        named[name], spelled[name] = value, key
    return named


def _convert(name: str, value: Any, where: str) -> Any:
    """A CLI string or a TOML value -> the typed value, or a one-line error."""
    opt = BY_NAME[name]
    field = f"--{name}" if where == "cli" else f"{PROJECT_FILE} [run] {name}"
    if opt.kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise UserError(field, f"{show(value)} is not a whole number", "", "Give e.g. 2")
        try:
            return int(value)
        except ValueError:
            raise UserError(
                field, f"{show(value)} is not a whole number", "", "Give e.g. 2"
            ) from None
    if opt.kind == "float":
        try:
            number = float(value) if not isinstance(value, bool) else float("nan")
        except (TypeError, ValueError):
            number = float("nan")
        if number != number or number in (float("inf"), float("-inf")):
            raise UserError(field, f"{show(value)} is not a number", "", f"Give e.g. {opt.example}")
        return number
    if opt.kind == "time":
        return parse_time(str(value), field)
    if name == "snapshot-limit":  # bytes: a limit may be under a megabyte (1K)
        return parse_size(str(value), field)
    if opt.kind == "mem":
        return parse_memory(str(value), field)
    if opt.kind == "flag":
        if not isinstance(value, bool):
            raise UserError(field, f"{show(value)} is not true or false", "", "Use true/false")
        return value
    if opt.kind == "list":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            raise UserError(field, f"{show(value)} is not a list of strings", "", 'Use ["..."]')
        return tuple(items)
    if opt.kind == "choice":
        if value not in opt.choices:
            raise UserError(
                field,
                f"{show(value)} is not allowed",
                f"one of {', '.join(opt.choices)}",
                f"Use e.g. {opt.example}",
            )
        return value
    if not isinstance(value, str):
        raise UserError(field, f"{show(value)} is not text", "", f"Use e.g. {opt.example}")
    if any(c in value for c in "\n\r\x00"):
        # Names and paths never hold these; refused here, the field named as given
        # (later they would surface in whatever they became part of, e.g. --output).
        raise UserError(field, f"{show(value)} holds a line break or NUL", "", "Remove it")
    return value


def layers(cli: Mapping[str, Any], cwd: Path, environ: Mapping[str, str]) -> Layers:
    """All layers -> typed values. `cli` holds only options the caller gave."""
    found = projectfile.find(cwd, environ)
    project_run, project_clusters = tables_of(found)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, raw in project_run.items():
        values[BY_NAME[key].dest] = _convert(key, raw, "project")
        sources[BY_NAME[key].dest] = "project"
    for key, env_name in SBATCH_ENV.items():
        if environ.get(env_name):
            values[key] = environ[env_name]
            sources[key] = f"env:{env_name}"
    for key, raw in cli.items():
        name = key.replace("_", "-")
        values[BY_NAME[name].dest] = _convert(name, raw, "cli")
        sources[BY_NAME[name].dest] = "cli"
    return Layers(
        RunOptions(**values),
        sources,
        found.path,
        dict(project_run),
        dict(project_clusters),
        found.warnings,
    )


def cli_options(cli: Mapping[str, Any]) -> RunOptions:
    """Options a command other than `run` takes from its own command line (no layers):
    converted and checked as `run`'s are. None or () values are not given."""
    given = {k: v for k, v in cli.items() if v is not None and v != ()}
    return RunOptions(**{k: _convert(k.replace("_", "-"), v, "cli") for k, v in given.items()})


def recorded_options(recorded: Mapping[str, Any]) -> RunOptions:
    """The options a run.json keeps (as given, secrets masked), typed. A key this version
    does not know, or a value it cannot read, is left out: an old record still reads."""
    typed: dict[str, Any] = {}
    for key, value in recorded.items():
        opt = BY_NAME.get(key.replace("_", "-"))
        if opt is None:
            continue
        if opt.kind == "flag" and value in ("true", "false"):
            value = value == "true"
        with contextlib.suppress(UserError):
            typed[opt.dest] = _convert(opt.name, value, "cli")
    return RunOptions(**typed)


def named_cluster(
    project_run: Mapping[str, Any], environ: Mapping[str, str]
) -> Optional[tuple[str, str]]:
    """The cluster the environment or the project file names, before any detection."""
    if environ.get("HPCLAUNCH_CLUSTER"):
        return environ["HPCLAUNCH_CLUSTER"], "env:HPCLAUNCH_CLUSTER"
    if project_run.get("cluster"):
        return str(project_run["cluster"]), "project"
    return None
