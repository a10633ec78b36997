"""A typed `RunOptions` handed to `hpclaunch.call` as `options=` (issue 35: a mapping "or
the typed options object"), turned back into the keywords `hpclaunch.run` takes, so that
it goes through the same layers, checks and record as a mapping does.

RunOptions holds what the layers made of the given text (times in seconds, memory in
MB, --snapshot-limit in bytes: config/options.py); these are written back in the forms
the layers read (basics/units' format_*), and a field left at its default (None, False,
()) is not given, as for the layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Union

from hpclaunch.basics.units import format_memory, format_size, format_time
from hpclaunch.config.options import RunOptions
from hpclaunch.errors import UserError

SIZE_IN_BYTES = "snapshot_limit"  # the one "mem" row the layers read as bytes (layering)


def given(options: Union[Mapping[str, Any], RunOptions, None]) -> dict[str, Any]:
    """`options` as the mapping of run keywords it stands for."""
    if options is None:
        return {}
    if not isinstance(options, RunOptions):
        return dict(options)
    out: dict[str, Any] = {}
    for row in fields(RunOptions):
        value = getattr(options, row.name)
        if value is None or value is False or value == ():
            continue
        out[row.name] = _as_given(row.name, row.metadata["row"]["kind"], value)
    return out


def _as_given(name: str, kind: str, value: Any) -> Any:
    if kind == "time":
        return format_time(value)
    if kind == "mem" and name == SIZE_IN_BYTES:
        text = format_size(value)
        if text.endswith("bytes"):  # no Slurm size says it; the layers read whole KiB
            raise UserError(
                f"options.{name}", f"{value} bytes", "whole KiB", "Give e.g. 64K or 500M"
            )
        return text
    if kind == "mem":
        return format_memory(value)
    if kind == "list":
        return list(value)
    return value
