"""Property test: arbitrary arguments reach the program byte for byte on both backends,
placeholders expand per rank, and nothing in them is ever executed.

Many argument lists share one job (joined by a separator the program splits on again),
so hypothesis can try dozens of lists while the suite submits only a few jobs.
"""

from __future__ import annotations

import json
import os
import re
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import PROGRAMS, Hpc

pytestmark = pytest.mark.testbed

NAMES = "rank|local_rank|world_size|local_world_size|node_rank|master_addr|master_port"
PLACEHOLDER = re.compile(r"\{\{(" + NAMES + r")\}\}|\{(" + NAMES + r")\}")
MARK = "__MARK__"  # replaced by a path: if any of these ever runs, that file appears
HOSTILE = [
    "",
    " ",
    "a b",
    "'",
    '"',
    "\\",
    "$HOME",
    "${HOME}",
    "$(touch __MARK__)",
    "`touch __MARK__`",
    "; touch __MARK__",
    "&& touch __MARK__",
    "| touch __MARK__",
    "\ntouch __MARK__\n",
    "'; touch __MARK__; '",
    '"; touch __MARK__; "',
    "$'\\x41'",
    "*",
    "~",
    "!!",
    "-",
    "--",
    "--help",
    "-N",
    "{rank}",
    "{{rank}}",
    "{local_rank}/{world_size}",
    '{"a": 1}',
    "{{x}}",
    "{x}",
    "{",
    "}",
    "}{",
    "{rank",
    "rank}",
    "ünïcödé ✓ 日本",
    "\t",
    "\r\n",
    "%s %n",
    "#",
    ":",
    "::",
    "-:-",
]
ARG = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20),
    st.binary(max_size=8).filter(lambda b: b"\x00" not in b).map(os.fsdecode),
)


def _expected(arg: str, env: dict[str, str]) -> str:
    values = {
        "rank": env["RANK"],
        "local_rank": env["LOCAL_RANK"],
        "world_size": env["WORLD_SIZE"],
        "local_world_size": env["LOCAL_WORLD_SIZE"],
        "node_rank": env["NODE_RANK"],
        "master_addr": env["MASTER_ADDR"],
        "master_port": env["MASTER_PORT"],
    }

    def sub(m: re.Match[str]) -> str:
        return "{" + m.group(1) + "}" if m.group(1) else values[m.group(2)]

    return PLACEHOLDER.sub(sub, arg)


def _check_batch(hpc: Hpc, lists: list[list[str]], cluster: list[str]) -> None:
    out = hpc.folder(f"o-{uuid.uuid4().hex[:8]}")
    marker = out / "EXECUTED"
    sep = f"--sep-{uuid.uuid4().hex}--"
    lists = [[a.replace(MARK, str(marker)) for a in args] for args in lists]
    flat: list[str] = []
    for args in lists:
        flat += [*args, sep]
    proc = hpc.run(
        "run",
        *cluster,
        "-N",
        "2",
        "--tasks-per-node",
        "1",
        "--wait",
        "--",
        "python3",
        str(PROGRAMS / "argv_dump.py"),
        str(out),
        *flat,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    dumps = [json.loads(p.read_text()) for p in sorted(out.glob("argv-*.json"))]
    assert sorted(d["rank"] for d in dumps) == ["0", "1"]
    for dump in dumps:
        got = [os.fsdecode(bytes.fromhex(h)) for h in dump["args"]]
        expected: list[str] = []
        for args in lists:
            expected += [_expected(a, dump["env"]) for a in args] + [sep]
        assert got == expected
    assert not marker.exists(), "an argument was executed"


LISTS = st.lists(st.lists(ARG, max_size=6), min_size=15, max_size=25)
SETTINGS = settings(
    max_examples=3,
    deadline=None,
    derandomize=False,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@SETTINGS
@given(lists=LISTS)
def test_arguments_reach_slurm_ranks_unchanged(hpc: Hpc, lists: list[list[str]]) -> None:
    _check_batch(hpc, lists, ["--cluster", "slurm"])


@SETTINGS
@given(lists=LISTS)
def test_arguments_reach_local_ranks_unchanged(hpc: Hpc, lists: list[list[str]]) -> None:
    _check_batch(hpc, lists, ["--cluster", "local"])


def test_every_hostile_argument_at_once(hpc: Hpc) -> None:
    _check_batch(hpc, [HOSTILE, list(reversed(HOSTILE))], ["--cluster", "slurm"])
