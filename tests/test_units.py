"""Slurm's time and memory formats (pure functions)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpclaunch.basics.units import format_memory, format_time, parse_memory, parse_time
from hpclaunch.errors import UserError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5", 300),
        ("0:30", 30),
        ("1:00", 60),
        ("1:00:00", 3600),
        ("2-00:00:00", 172800),
        ("1-2", 93600),
        ("1-2:30", 95400),
        ("10:05", 605),
    ],
)
def test_parse_time_accepts_slurm_formats(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "1:2:3:4", "-5", "1-", "0", "0:00", "5m", "1.5"])
def test_parse_time_refuses_garbage(text: str) -> None:
    with pytest.raises(UserError) as info:
        parse_time(text)
    assert info.value.field == "--time"


@given(st.integers(min_value=1, max_value=400 * 86400))
def test_time_round_trips(seconds: int) -> None:
    assert parse_time(format_time(seconds)) == seconds


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("60G", 61440),
        ("500M", 500),
        ("1024", 1024),
        ("0", 0),
        ("1T", 1048576),
        ("60GB", 61440),
        ("2048K", 2),
    ],
)
def test_parse_memory(text: str, mib: int) -> None:
    assert parse_memory(text) == mib


@pytest.mark.parametrize("text", ["", "lots", "-1G", "1.5G", "60 G", "60X"])
def test_parse_memory_refuses_garbage(text: str) -> None:
    with pytest.raises(UserError):
        parse_memory(text)


@given(st.integers(min_value=1, max_value=10**8))
def test_memory_round_trips(mib: int) -> None:
    assert parse_memory(format_memory(mib)) == mib
