"""The points of a sweep (each array task's parameters and extra program arguments) from
``--grid``, ``--configs`` and ``--repeat``, all checked before anything is submitted.

Order: configs outer, grids inner (the first ``--grid`` outermost, as itertools.product),
``--repeat``'s ``seed`` innermost; ``params`` keep it too: config keys, grid names, seed.

``--configs FILE`` by suffix, UTF-8 (a byte order mark is ignored); lines and entries
count from 1:
- ``.txt``: a line is extra program arguments, split like a shell would (shlex, POSIX)
  but never run by one; blank lines and ``#`` comment lines skipped; no parameters.
- ``.json``: a list of objects; ``.jsonl``: one object per non-empty line;
  ``.toml``: one ``[[points]]`` table a point; ``.yaml``/``.yml``: a list of mappings.
Such entries map NAME -> a string, integer, float or boolean. A NAME is an ASCII
identifier, unique in its sweep even ignoring case (it becomes HPCLAUNCH_PARAM_<NAME>),
never a rank placeholder's.
"""

from __future__ import annotations

import importlib
import itertools
import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from hpclaunch.config.tomlfiles import loads as toml_loads
from hpclaunch.errors import UserError
from hpclaunch.node import PARAM_PREFIX, RANK_PLACEHOLDERS

ParamValue = Union[str, int, float, bool]
# (params, extra program args, source) of one configuration
Config = tuple[dict[str, ParamValue], tuple[str, ...], str]

# The in-job code's names, defined once on the host side in hpclaunch.node
PARAM_ENV_PREFIX = PARAM_PREFIX
SUFFIXES = (".txt", ".json", ".jsonl", ".toml", ".yaml", ".yml")
CONFIGS, GRID, REPEAT = "--configs", "--grid", "--repeat"

_RANK = frozenset(RANK_PLACEHOLDERS)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # ASCII only: str.isidentifier takes Unicode
_VALUE_TYPES = "a string, integer, float or boolean"


@dataclass(frozen=True)
class Point:
    """One array task of a sweep."""

    index: int
    params: Mapping[str, ParamValue]
    args: tuple[str, ...] = ()
    source: str = ""

    def env(self) -> dict[str, str]:
        """HPCLAUNCH_PARAM_<NAME> -> value text, in the order of ``params``."""
        return {PARAM_ENV_PREFIX + k.upper(): format_value(v) for k, v in self.params.items()}

    def label(self) -> str:
        """Short text for tables: the extra args, then NAME=VALUE words, shell-quoted where
        needed and control characters escaped (a table row stays one line); "-" if none."""
        words = [*self.args, *(f"{k}={format_value(v)}" for k, v in self.params.items())]
        return _printable(shlex.join(words)) if words else "-"


def format_value(value: ParamValue) -> str:
    """The text of a value: what ``{name}`` expands to and HPCLAUNCH_PARAM_NAME holds."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):  # before int: bool is an int
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return repr(value)


def params_json(point: Point) -> str:
    return _COMPACT_JSON(dict(point.params))


# What json.dumps(separators=(",", ":"), ensure_ascii=False) makes, its encoder made once
# (json.dumps makes one a call when given arguments; a sweep asks once a point).
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def parse_grid(spec: str) -> tuple[str, tuple[str, ...]]:
    """``lr=0.1,0.01`` -> ("lr", ("0.1", "0.01")): the values as typed, but for the
    blanks around each (``lr=0.1, 0.2`` is 0.1 and 0.2, not " 0.2")."""
    name, eq, text = spec.partition("=")
    fix = "Write it as --grid NAME=V1,V2,..."
    if not eq:
        raise UserError(GRID, f"{spec!r} has no '='", "NAME=V1,V2,...", fix)
    _check_name(GRID, name, "")
    if not text:
        raise UserError(GRID, f"{spec!r} has no values", "NAME=V1,V2,...", fix)
    values = tuple(value.strip() for value in text.split(","))
    if "" in values:
        raise UserError(GRID, f"{spec!r} has an empty value", "", "Remove the extra comma")
    if len(set(values)) < len(values):
        twice = next(v for i, v in enumerate(values) if v in values[:i])
        # the same point twice is a mistake; the way to run points again is --repeat
        raise UserError(GRID, f"{spec!r} gives {twice!r} twice", "", "Give it once; see --repeat")
    if "\0" in text:
        raise UserError(GRID, f"{spec!r} holds a NUL character", "", "Remove it")
    return name, values


def build_points(
    grids: Sequence[str],
    configs: Optional[Path],
    repeat: Optional[int],
    max_points: Optional[int] = None,
) -> list[Point]:
    """Every point of the sweep, in order; UserError before anything is built if the
    request is empty, inconsistent or over ``max_points``."""
    if not grids and configs is None and repeat is None:
        fix = "Give --grid NAME=V1,V2, --configs FILE, --repeat N or --optuna SPACE"
        raise UserError("sweep", "nothing to sweep over", "", fix)
    if repeat is not None and repeat < 1:
        raise UserError(REPEAT, f"--repeat {repeat} is below 1", "", "Give --repeat 1 or more")
    axes: list[tuple[str, tuple[str, ...]]] = []
    for spec in grids:
        name, values = parse_grid(spec)
        if any(name == other for other, _ in axes):
            raise UserError(GRID, f"{name} is given twice", "", "Give each --grid NAME once")
        axes.append((name, values))
    entries: list[Config] = [({}, (), "")] if configs is None else read_configs(configs)
    _check_names(entries, axes, repeat)
    # Counted before anything is built: refusing 10**9 points must be instant.
    count = len(entries) * math.prod(len(values) for _, values in axes) * (repeat or 1)
    if max_points is not None and count > max_points:
        raise UserError("sweep", f"{count} points", f"at most {max_points}", "Sweep fewer values")
    names = [name for name, _ in axes]
    combos = [dict(zip(names, combo)) for combo in itertools.product(*(v for _, v in axes))]
    seeds: list[dict[str, ParamValue]] = [{"seed": s} for s in range(repeat or 0)] or [{}]
    points: list[Point] = []
    for params, args, source in entries:
        for combo in combos:
            for seed in seeds:
                points.append(Point(len(points), {**params, **combo, **seed}, args, source))
    return points


def _check_names(
    entries: Sequence[Config], axes: Sequence[tuple[str, tuple[str, ...]]], repeat: Optional[int]
) -> None:
    """Names unique in the sweep, also ignoring case (one HPCLAUNCH_PARAM_ each)."""
    seen: dict[str, tuple[str, str]] = {}  # lower case -> (name, where it was first seen)

    def claim(field: str, name: str, where: str) -> None:
        (first, at) = seen.setdefault(name.lower(), (name, where))
        if first != name:
            problem = f"{name} ({where}) and {first} ({at}) differ only by case"
            env = f"both would be {PARAM_ENV_PREFIX}{name.upper()}"
            raise UserError(field, problem, env, "Rename one of them")

    config_names: dict[str, str] = {}
    for params, _, source in entries:
        for name in params:
            config_names.setdefault(name, source)
            claim(CONFIGS, name, source)
    for name, _ in axes:
        if name in config_names:
            problem = f"{name} is set by --grid and by {config_names[name]}"
            raise UserError(GRID, problem, "", "Set it in one place")
        claim(GRID, name, "--grid")
    if repeat is not None and "seed" in seen:
        problem = "{} is set by {}, and --repeat sets seed too".format(*seen["seed"])
        raise UserError(REPEAT, problem, "", "Drop --repeat or the seed parameter")


def read_configs(path: Path) -> list[Config]:
    """The configurations in ``path``, one (params, args, source) each, in file order."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        limit = "one of " + ", ".join(SUFFIXES)
        raise _refuse(f"{path} has an unknown suffix {path.suffix!r}", limit, "Rename it")
    text = _read_text(path)
    found: list[Config] = []
    if text.strip():
        if suffix == ".txt":
            found = _read_txt(text, path)
        elif suffix == ".jsonl":
            found = _read_jsonl(text, path)
        else:
            data = _parse_structured(text, path, suffix)
            found = [
                _config(entry, f"{path} entry {n}", f"{path.name} entry {n}")
                for n, entry in enumerate(data, 1)
            ]
    if not found:
        raise _refuse(f"{path} holds no configuration", "", "Add at least one")
    return found


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise _refuse(f"cannot read {path}: {exc.strerror or exc}", "", "Check the path") from None
    try:
        return raw.decode("utf-8-sig")  # editors on Windows write a byte order mark
    except UnicodeDecodeError as exc:
        raise _refuse(f"{path} is not UTF-8 (byte {exc.start})", "", "Save it as UTF-8") from None


def _read_txt(text: str, path: Path) -> list[Config]:
    found: list[Config] = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            args = shlex.split(line, comments=False, posix=True)
        except ValueError as exc:  # "No closing quotation", "No escaped character"
            raise _refuse(f"{path}:{number}: {exc}", "shell quoting", "Close the quote") from None
        if any("\0" in arg for arg in args):
            raise _refuse(f"{path}:{number}: holds a NUL character", "", "Remove it")
        found.append(({}, tuple(args), f"{path.name}:{number}"))
    return found


class _Object:
    """A JSON object as its pairs: json.loads keeps only the last of a name given twice."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def _json(text: str, path: Path, line: Optional[int] = None) -> Any:
    """One JSON document; ``line`` is its line in the file (a .jsonl line)."""
    try:
        return json.loads(text, object_pairs_hook=_Object)
    except json.JSONDecodeError as exc:
        at = f"{path}:{exc.lineno if line is None else line}"
        problem = f"{at}: not valid JSON: {exc.msg} (column {exc.colno})"
    except (ValueError, RecursionError) as exc:  # an integer of 4300+ digits, deep nesting
        at = str(path) if line is None else f"{path}:{line}"
        problem = f"{at}: not valid JSON: {exc}"
    raise _refuse(problem)


def _read_jsonl(text: str, path: Path) -> list[Config]:
    found: list[Config] = []
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            entry = _json(line, path, number)
            found.append(_config(entry, f"{path}:{number}", f"{path.name}:{number}"))
    return found


def _parse_structured(text: str, path: Path, suffix: str) -> list[Any]:
    """The list of entries of a .json, .toml or .yaml file."""
    if suffix == ".json":
        data = _json(text, path)
    elif suffix == ".toml":
        try:
            table = toml_loads(text, path, CONFIGS)
        except (ValueError, RecursionError) as exc:  # an integer of 4300+ digits
            raise _refuse(f"{path} is not valid TOML: {exc}") from None
        extra = sorted(set(table) - {"points"})
        if extra:
            raise _refuse(f"{path}: unknown top-level key {extra[0]!r}", "only [[points]]")
        data = table.get("points", [])
    else:
        data = _parse_yaml(text, path)
    if not isinstance(data, list):
        what, limit = ("points", "[[points]] tables") if suffix == ".toml" else ("it", "")
        raise _refuse(f"{path}: {what} is {_kind(data)}, not a list of mappings", limit)
    return data


def _parse_yaml(text: str, path: Path) -> Any:
    try:
        # imported by name: PyYAML is optional and its type stubs may be absent
        yaml = importlib.import_module("yaml")
    except ImportError:
        problem = f"{path} is YAML, and PyYAML is not installed"
        raise _refuse(problem, "", "pip install 'hpclaunch[yaml]'") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if isinstance(node, yaml.SequenceNode):
            for n, item in enumerate(node.value, 1):
                _yaml_twice(yaml, item, path, n)
        return [] if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise _refuse(f"{at}: not valid YAML: {problem}") from None
    except (ValueError, RecursionError) as exc:
        raise _refuse(f"{path}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _yaml_twice(yaml: Any, item: Any, path: Path, n: int) -> None:
    """PyYAML keeps the last of a key given twice; YAML says keys are unique: refused."""
    if not isinstance(item, yaml.MappingNode):
        return
    seen: set[str] = set()
    for key in (key for key, _ in item.value if isinstance(key, yaml.ScalarNode)):
        if key.value in seen:
            line = key.start_mark.line + 1
            raise _refuse(f"{path}:{line}: entry {n} sets {key.value} twice", "", "Keep one")
        seen.add(key.value)


def _config(entry: Any, where: str, source: str) -> Config:
    """One structured entry -> its checked params."""
    if isinstance(entry, _Object):
        pairs = entry.pairs
    elif isinstance(entry, dict):
        pairs = list(entry.items())
    else:
        raise _refuse(f"{where} is {_kind(entry)}, not a mapping", "NAME -> value")
    params: dict[str, ParamValue] = {}
    for name, value in pairs:
        _check_name(CONFIGS, name, where)
        if name in params:
            raise _refuse(f"{where} sets {name} twice", "", "Keep one")
        if not isinstance(value, (str, int, float)):
            raise _refuse(f"{where}: {name} is {_kind(value)}", _VALUE_TYPES, "Write a string")
        if isinstance(value, str) and "\0" in value:
            raise _refuse(f"{where}: {name} holds a NUL character", "", "Remove it")
        params[name] = value
    return params, (), source


def _check_name(field: str, name: object, where: str) -> None:
    at = f"{where}: " if where else ""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        limit = "ASCII letters, digits and _, not first a digit"
        raise UserError(field, f"{at}name {name!r} is not an identifier", limit, "Rename it")
    if name.lower() in _RANK:  # any case: {RANK} beside {rank} would only confuse
        limit = "reserved: " + ", ".join(RANK_PLACEHOLDERS)
        raise UserError(field, f"{at}{name!r} is named like a rank placeholder", limit, "Rename it")


def _refuse(problem: str, limit: str = "", fix: str = "Fix the file") -> UserError:
    return UserError(CONFIGS, problem, limit, fix)


def _kind(value: object) -> str:
    name = "mapping" if isinstance(value, (_Object, dict)) else type(value).__name__
    return "null" if value is None else ("an " if name[0] in "aeiou" else "a ") + name


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def placeholder_names(arg: str) -> list[str]:
    """The ``{identifier}`` names in ``arg``, scanned as bootstrap.expand does: left to
    right, at each ``{`` the escape ``{{name}}`` (a literal, no name) tried first. Other
    brace text (JSON, ``{}``, ``{1x}``) is no placeholder: the scan goes on inside it."""
    names: list[str] = []
    i = 0
    while True:
        start = arg.find("{", i)
        close = arg.find("}", start) if start >= 0 else -1
        if close < 0:
            return names
        escape = arg.startswith("{{", start) and arg.startswith("}}", close)
        if escape and _NAME.fullmatch(arg, start + 2, close):
            i = close + 2
        elif _NAME.fullmatch(arg, start + 1, close):
            names.append(arg[start + 1 : close])
            i = close + 1
        else:
            i = start + 1


def check_placeholders(program_args: Sequence[str], points: Sequence[Point]) -> None:
    """Every ``{identifier}`` in the program's arguments and in each point's extra args
    is a rank placeholder or a parameter of that point; else UserError naming it."""
    shared = [(arg, n) for arg in program_args for n in placeholder_names(arg) if n not in _RANK]
    for point in points:
        for arg, name in shared:
            if name not in point.params:
                # named only when some points do set it: then it is this point that lacks it
                lacks = [p for p in points if name not in p.params]
                _unknown(name, arg, point, "" if len(lacks) == len(points) else "for")
        for arg in point.args:
            for name in placeholder_names(arg):
                if name not in _RANK and name not in point.params:
                    _unknown(name, arg, point, "of")


def _unknown(name: str, arg: str, point: Point, word: str) -> None:
    where = ""
    if word:
        where = f" {word} point {point.index}" + (f" ({point.source})" if point.source else "")
    problem = f"unknown placeholder {{{name}}} in argument {arg!r}{where}"
    known = "known: " + ", ".join(sorted({*RANK_PLACEHOLDERS, *point.params}))
    raise UserError("PROGRAM", problem, known, f"Write {{{{{name}}}}} for a literal {{{name}}}")
