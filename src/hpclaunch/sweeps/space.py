"""The SPACE_FILE of `hpclaunch sweep --optuna`: one entry per parameter, named like the
arguments of Optuna's `suggest_*` calls, e.g. (TOML)

    x = {type = "float", low = -5.0, high = 5.0}          # log, step optional
    layers = {type = "int", low = 1, high = 4}
    opt = {type = "categorical", choices = ["adam", "sgd"]}

Parsing and validation are pure Python: the submit host may lack Optuna and still gets
every mistake in the file as one line. Only `to_distributions` imports Optuna."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from hpclaunch.config.tomlfiles import read_toml
from hpclaunch.errors import UserError, show

if TYPE_CHECKING:
    import optuna

FIELD = "--optuna"
OPTUNA_FIX = "pip install 'hpclaunch[optuna]'"
YAML_FIX = "pip install 'hpclaunch[yaml]'"

Choice = Union[str, int, float, bool, None]

TYPES = ("float", "int", "categorical")
_KEYS = {
    "float": ("type", "low", "high", "log", "step"),
    "int": ("type", "low", "high", "log", "step"),
    "categorical": ("type", "choices"),
}
# The per-rank placeholders of the program line ({rank}, ...): a parameter of the same
# name would be ambiguous there (kept in step with node/bootstrap.py's PLACEHOLDERS).
RESERVED = (
    "rank",
    "local_rank",
    "world_size",
    "local_world_size",
    "node_rank",
    "master_addr",
    "master_port",
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class SpaceParam:
    """One parameter of the search space, validated; int parameters hold int bounds."""

    name: str
    type: str  # "float" | "int" | "categorical"
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None
    choices: tuple[Choice, ...] = ()


def require_optuna() -> None:
    """UserError saying how to install Optuna when it cannot be imported here."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UserError(FIELD, "Optuna is not installed here", "", OPTUNA_FIX) from None


def read_space(path: Path) -> tuple[SpaceParam, ...]:
    """The parameters of a .toml, .yaml or .yml SPACE_FILE, in file order."""
    suffix = path.suffix.lower()
    if suffix == ".toml":
        data: object = read_toml(path, FIELD)
    elif suffix in (".yaml", ".yml"):
        data = _read_yaml(path)
    else:
        raise UserError(
            FIELD,
            f"{path}: the SPACE_FILE suffix {show(path.suffix)} is not known",
            ".toml, .yaml or .yml",
            "Rename the file or write it as TOML",
        )
    return parse_space(data, str(path))


def parse_space(data: object, file: str) -> tuple[SpaceParam, ...]:
    """The parameters of an already-loaded SPACE_FILE; `file` names it in errors."""
    if data is None or (isinstance(data, Mapping) and not data):
        raise UserError(
            FIELD,
            f"{file}: the file holds no parameters",
            "",
            'Add one entry per parameter, e.g. x = {type = "float", low = 0.0, high = 1.0}',
        )
    if not isinstance(data, Mapping):
        raise UserError(
            FIELD,
            f"{file}: the file must map parameter names to tables, not {_kind(data)}",
            "",
            'Write e.g. x = {type = "float", low = 0.0, high = 1.0}',
        )
    params: list[SpaceParam] = []
    seen: dict[str, str] = {}  # casefolded -> as written
    for name, entry in data.items():
        _check_name(file, name, seen)
        params.append(_param(file, name, entry))
    return tuple(params)


def to_distributions(
    space: Sequence[SpaceParam],
) -> dict[str, optuna.distributions.BaseDistribution]:
    """Optuna's distributions for a validated space (imports Optuna)."""
    require_optuna()
    from optuna.distributions import (
        BaseDistribution,
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    out: dict[str, BaseDistribution] = {}
    for p in space:
        try:
            if p.type == "categorical":
                out[p.name] = CategoricalDistribution(list(p.choices))
                continue
            assert p.low is not None and p.high is not None  # read_space checked
            if p.type == "int":
                step = 1 if p.step is None else int(p.step)
                out[p.name] = IntDistribution(int(p.low), int(p.high), log=p.log, step=step)
            else:
                out[p.name] = FloatDistribution(p.low, p.high, log=p.log, step=p.step)
        except ValueError as exc:
            # read_space catches what Optuna refuses; this covers a hand-built SpaceParam.
            raise UserError(FIELD, f"{p.name}: {exc}", "", "Fix the SPACE_FILE") from None
    return out


def _read_yaml(path: Path) -> object:
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        raise UserError(
            FIELD, f"{path}: reading a YAML SPACE_FILE needs PyYAML", "", YAML_FIX
        ) from None
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise UserError(
            FIELD, f"cannot read {path}: {exc.strerror}", "", "Check the path"
        ) from None
    except UnicodeDecodeError as exc:
        raise UserError(
            FIELD, f"{path} is not UTF-8 text (byte {exc.start})", "", "Save it as UTF-8"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(
            FIELD, f"{path} is not valid YAML{where}: {problem}", "", "Fix the file"
        ) from None


def _check_name(file: str, name: object, seen: dict[str, str]) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise UserError(
            FIELD,
            f"{file}: {show(name)}: a parameter name must be an identifier",
            "letters, digits and _, not starting with a digit",
            "Rename the parameter",
        )
    if name in RESERVED:
        raise UserError(
            FIELD,
            f"{file}: {name}: the name is taken by the per-rank placeholder {{{name}}}",
            ", ".join(RESERVED),
            "Rename the parameter",
        )
    # A parameter also travels as an upper-cased environment variable, so case alone
    # must not tell two names apart.
    folded = name.casefold()
    if folded in seen:
        raise UserError(
            FIELD,
            f"{file}: {name}: the name differs from {seen[folded]} only by case",
            "",
            "Rename one of them",
        )
    seen[folded] = name


def _param(file: str, name: str, entry: object) -> SpaceParam:
    where = f"{file}: {name}"
    if not isinstance(entry, Mapping):
        raise UserError(
            FIELD,
            f"{where}: the entry must be a table, not {_kind(entry)}",
            "",
            'Write e.g. {type = "float", low = 0.0, high = 1.0}',
        )
    kind = entry.get("type")
    if kind not in TYPES:
        problem = "the entry has no type" if kind is None else f"unknown type {show(kind)}"
        raise UserError(FIELD, f"{where}: {problem}", " | ".join(TYPES), "Set type")
    unknown = [str(k) for k in entry if k not in _KEYS[kind]]
    if unknown:
        raise UserError(
            FIELD,
            f"{where}: unknown key {', '.join(sorted(unknown))}",
            f"{kind} takes {', '.join(_KEYS[kind])}",
            "Remove or rename it",
        )
    if kind == "categorical":
        return SpaceParam(name, kind, choices=_choices(where, entry.get("choices")))
    return _numeric(where, name, kind, entry)


def _numeric(where: str, name: str, kind: str, entry: Mapping[Any, Any]) -> SpaceParam:
    low = _number(where, "low", entry.get("low"), kind, required=True)
    high = _number(where, "high", entry.get("high"), kind, required=True)
    step = _number(where, "step", entry.get("step"), kind, required=False)
    log = entry.get("log", False)
    assert low is not None and high is not None
    if not isinstance(log, bool):
        raise UserError(FIELD, f"{where}: log {show(log)} is not true or false", "", "Fix log")
    # low == high is allowed: Optuna then always suggests that one value.
    if low > high:
        raise UserError(FIELD, f"{where}: low {low} is above high {high}", "", "Swap them")
    if log and step is not None:
        raise UserError(
            FIELD,
            f"{where}: log and step cannot be combined",
            "Optuna refuses a stepped log scale",
            "Remove one of them",
        )
    if log and low <= 0:
        raise UserError(
            FIELD, f"{where}: log needs low above 0, got {low}", "", "Raise low or drop log"
        )
    if step is not None and step <= 0:
        raise UserError(FIELD, f"{where}: step {step} is not above 0", "", "Fix step")
    return SpaceParam(name, kind, low=low, high=high, log=log, step=step)


def _number(where: str, key: str, value: object, kind: str, *, required: bool) -> Optional[float]:
    if value is None:
        if required:
            raise UserError(FIELD, f"{where}: missing {key}", "", f"Set {key}")
        return None
    if isinstance(value, str):
        # PyYAML reads 1e-3 (no dot) as text; take it as the number the user meant.
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(FIELD, f"{where}: {key} {show(value)} is not a number", "", f"Fix {key}")
    if not math.isfinite(value):
        raise UserError(FIELD, f"{where}: {key} {value} is not finite", "", f"Fix {key}")
    if kind == "int":
        if value != int(value):
            raise UserError(
                FIELD, f"{where}: {key} {value} is not an integer", "int parameter", f"Fix {key}"
            )
        return int(value)
    return float(value)


def _choices(where: str, value: object) -> tuple[Choice, ...]:
    if value is None:
        raise UserError(FIELD, f"{where}: missing choices", "", 'Set e.g. choices = ["a", "b"]')
    if not isinstance(value, list):
        raise UserError(
            FIELD, f"{where}: choices must be a list, not {_kind(value)}", "", "Fix choices"
        )
    if not value:
        raise UserError(FIELD, f"{where}: choices is empty", "", "List at least one choice")
    seen: set[tuple[type, Choice]] = set()
    for choice in value:
        if choice is not None and not isinstance(choice, (str, int, float, bool)):
            raise UserError(
                FIELD,
                f"{where}: choice {show(choice)} is not a string, number, boolean or null",
                "",
                "Fix choices",
            )
        # Keyed by type too: 1, 1.0 and true compare equal but are different choices.
        key = (type(choice), choice)
        if key in seen:
            raise UserError(
                FIELD, f"{where}: choice {show(choice)} appears twice", "", "Remove one"
            )
        seen.add(key)
    return tuple(value)


def _kind(value: object) -> str:
    names: dict[type, str] = {list: "a list", str: "a string", dict: "a table"}
    return names.get(type(value), type(value).__name__)
