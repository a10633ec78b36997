"""Slurm's time and memory formats, parsed and printed (pure functions)."""

from __future__ import annotations

import re

from hpclaunch.errors import UserError, show

_TIME_FIX = "Use minutes (30), MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, as Slurm does"


def parse_time(text: str, field: str = "--time") -> int:
    """Seconds for a Slurm time string; `5` is five minutes, like sbatch.

    Accepted: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (sbatch(1) "-t"). 'infinite' and
    'unlimited' are refused: a job always needs a limit a scheduler can plan with.
    """
    value = text.strip()
    days = 0
    rest = value
    if "-" in value:
        day_part, rest = value.split("-", 1)
        if not day_part.isdigit():
            raise UserError(field, f"{show(text)} is not a time", "", _TIME_FIX)
        days = int(day_part)
        parts = rest.split(":")
        if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
            raise UserError(field, f"{show(text)} is not a time", "", _TIME_FIX)
        nums = [int(p) for p in parts] + [0] * (3 - len(parts))
        hours, minutes, seconds = nums
    else:
        parts = rest.split(":")
        if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
            raise UserError(field, f"{show(text)} is not a time", "", _TIME_FIX)
        nums = [int(p) for p in parts]
        if len(nums) == 1:
            hours, minutes, seconds = 0, nums[0], 0
        elif len(nums) == 2:
            hours, minutes, seconds = 0, nums[0], nums[1]
        else:
            hours, minutes, seconds = nums
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise UserError(field, f"{show(text)} is zero", "a job needs at least 1 minute", _TIME_FIX)
    return total


def format_time(seconds: int) -> str:
    """Slurm's D-HH:MM:SS (or HH:MM:SS under a day)."""
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


_MEM_RE = re.compile(r"^([0-9]+)([KMGT]?)B?$", re.IGNORECASE)
_MEM_FACTOR = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "": 1}


def parse_memory(text: str, field: str = "--mem") -> int:
    """Mebibytes for a Slurm memory size: `60G`, `500M`, `1024` (megabytes), `0` = all."""
    match = _MEM_RE.match(text.strip())
    if not match:
        raise UserError(
            field,
            f"{show(text)} is not a memory size",
            "",
            "Use a number with an optional K, M, G or T suffix, e.g. 60G; 0 means all of a node's",
        )
    number, unit = int(match.group(1)), match.group(2).upper()
    return (
        int(number * _MEM_FACTOR[unit]) if unit != "K" else max(1, number // 1024) if number else 0
    )


def format_memory(mebibytes: int) -> str:
    """The shortest exact Slurm form: 61440 -> 60G, 500 -> 500M, 0 -> 0."""
    if mebibytes == 0:
        return "0"
    if mebibytes % (1024 * 1024) == 0:
        return f"{mebibytes // (1024 * 1024)}T"
    if mebibytes % 1024 == 0:
        return f"{mebibytes // 1024}G"
    return f"{mebibytes}M"


_SIZE_FACTOR = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "": 1 << 20}


def parse_size(text: str, field: str = "--snapshot-limit") -> int:
    """Bytes for a Slurm-style size: `1K` = 1024, `500M`, `2G`, `1T`; a plain number is
    megabytes (MiB), as for --mem."""
    match = _MEM_RE.match(text.strip())
    if not match:
        raise UserError(
            field,
            f"{show(text)} is not a size",
            "",
            "Use a number with an optional K, M, G or T suffix, e.g. 500M or 64K "
            "(a plain number is megabytes)",
        )
    return int(match.group(1)) * _SIZE_FACTOR[match.group(2).upper()]


def format_size(nbytes: int) -> str:
    """The shortest exact form parse_size() reads back: 1024 -> 1K, 200 MiB -> 200M, 0 -> 0;
    a size that is not whole KiB in bytes (1000 -> '1000 bytes')."""
    if nbytes == 0:
        return "0"
    for unit in "TGMK":
        if nbytes % _SIZE_FACTOR[unit] == 0:
            return f"{nbytes // _SIZE_FACTOR[unit]}{unit}"
    return f"{nbytes} bytes"
