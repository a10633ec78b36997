"""Frozen dataclass records validated as pydantic models would validate them.

The cluster profiles (profiles.py) are such records. Importing pydantic and building its
schemas cost more than the rest of `hpclaunch run`, so data whose every value already has
its field's exact type (the built-in profiles, discovered partitions, most user files) is
taken as it is (`_build`); only the rest meets pydantic, through a model mirrored from the
dataclass (`_model`), whose result is turned back into the dataclasses (`_from_model`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal, Optional, TypeVar, Union

from hpclaunch.errors import HpclaunchError

if TYPE_CHECKING:
    from pydantic import BaseModel

R = TypeVar("R", bound="_Record")


def _field(*, alias: str = "", before: Optional[Callable[[Any, Any], Any]] = None) -> Any:
    """An optional field with its TOML key (`alias`) and a conversion run before validation."""
    return field(default=None, metadata={"alias": alias, "before": before})


class _Record:
    """What callers use of pydantic's BaseModel API, on the frozen dataclasses below."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @classmethod
    def model_validate(cls: type[R], data: Any) -> R:
        """Validated like a pydantic model with extra="forbid" (raises ValidationError)."""
        return _validate(cls, data)

    def model_copy(self: R, *, update: Optional[Mapping[str, Any]] = None) -> R:
        return dataclasses.replace(self, **(update or {}))


class _Topology:
    """topology.Topology in the type hints: imported only once a profile has a topology."""


class _Decline(Exception):
    """A value is not plainly of its field's type: pydantic decides."""


_SPECS: dict[type[Any], list[tuple[dataclasses.Field[Any], str, Any]]] = {}
_MODELS: dict[type[Any], type[BaseModel]] = {}
_SOURCE: dict[type[Any], type[Any]] = {}  # pydantic model -> its dataclass


def _topology() -> type[Any]:
    from hpclaunch.config.topology import Topology

    return Topology


def _specs(cls: type[Any]) -> list[tuple[dataclasses.Field[Any], str, Any]]:
    """(field, its key in the data, its type) per field of a dataclass, in order."""
    if cls not in _SPECS:
        hints = typing.get_type_hints(cls, localns={"Topology": _Topology})
        fields = dataclasses.fields(cls)
        _SPECS[cls] = [(f, f.metadata.get("alias") or f.name, hints[f.name]) for f in fields]
    return _SPECS[cls]


def _exact(tp: Any, value: Any) -> Any:
    """`value` as pydantic would return it, when it already has exactly type `tp`."""
    tp = _topology() if tp is _Topology else tp
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in (str, bool, int) and type(value) is tp:
        return value
    if origin is Union and len(args) == 2 and args[1] is type(None):  # Optional[X]
        return None if value is None else _exact(args[0], value)
    if origin is Literal and type(value) is str and value in args:
        return value
    if origin is tuple and args[1:] == (...,) and type(value) in (list, tuple):
        return tuple(_exact(args[0], item) for item in value)
    if origin is dict and type(value) is dict:
        return {_exact(args[0], k): _exact(args[1], v) for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return value if isinstance(value, tp) else _build(tp, value)
    if isinstance(tp, type) and type(value) is dict and hasattr(tp, "model_validate"):
        return tp.model_validate(value)  # a pydantic model: topology.Topology today
    raise _Decline


def _build(cls: type[Any], data: Any) -> Any:
    """The dataclass from data that pydantic would take unchanged; else an exception."""
    specs = _specs(cls)
    if type(data) is not dict or not data.keys() <= {key for _, key, _ in specs}:
        raise _Decline  # not a table, or an extra key
    values: dict[str, Any] = {}
    for spec, key, tp in (s for s in specs if s[1] in data):
        before = spec.metadata.get("before")
        values[spec.name] = _exact(tp, before(cls, data[key]) if before else data[key])
    return cls(**values)  # TypeError when a required field is missing


def _mirror(tp: Any) -> Any:
    """`tp` with every dataclass in it replaced by its pydantic model."""
    tp = _topology() if tp is _Topology else tp
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _model(tp)
    origin, args = typing.get_origin(tp), tuple(_mirror(a) for a in typing.get_args(tp))
    if origin is Union:
        return Union.__getitem__(args)
    return origin.__class_getitem__(args) if origin in (tuple, dict) else tp


def _model(cls: type[Any]) -> type[BaseModel]:
    """The pydantic model of a dataclass: same name, fields, aliases, defaults, validators."""
    if cls in _MODELS:
        return _MODELS[cls]
    from pydantic import ConfigDict, Field, create_model, field_validator

    fields: dict[str, Any] = {}
    validators: dict[str, Any] = {}
    for spec, key, tp in _specs(cls):
        info: dict[str, Any] = {"alias": key} if key != spec.name else {}
        if spec.default_factory is not dataclasses.MISSING:
            info["default_factory"] = spec.default_factory
        elif spec.default is not dataclasses.MISSING:
            info["default"] = spec.default
        fields[spec.name] = (_mirror(tp), Field(**info))
        if spec.metadata.get("before"):
            check = field_validator(spec.name, mode="before")(spec.metadata["before"])
            validators[f"_before_{spec.name}"] = check
    config = ConfigDict(frozen=True, extra="forbid")
    model: type[BaseModel] = create_model(
        cls.__name__, __config__=config, __validators__=validators, **fields
    )
    _MODELS[cls], _SOURCE[model] = model, cls
    return model


def _from_model(value: Any) -> Any:
    """A validated pydantic value with its models turned back into the dataclasses."""
    cls = _SOURCE.get(type(value))
    if cls is not None:
        return cls(**{f.name: _from_model(getattr(value, f.name)) for f in dataclasses.fields(cls)})
    if type(value) is tuple:
        return tuple(_from_model(item) for item in value)
    if type(value) is dict:
        return {k: _from_model(v) for k, v in value.items()}
    return value


def _validate(cls: type[R], data: Any) -> R:
    if isinstance(data, cls):
        return data  # as pydantic returns an instance of the model
    try:
        return typing.cast(R, _build(cls, data))
    except (_Decline, HpclaunchError, ValueError, TypeError):
        pass  # pydantic gives the value, or the error, it always gave
    return typing.cast(R, _from_model(_model(cls).model_validate(data)))
