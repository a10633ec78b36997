"""states.py: the state table against Slurm's own man pages, and parse().

The documented states and short codes are read from the installed squeue(1) and sacct(1)
(JOB STATE CODES), never copied here, so a Slurm upgrade that adds a state fails this test
until the table has a row for it.
"""

from __future__ import annotations

import gzip
import json
import re
import signal
from pathlib import Path
from typing import Optional

import pytest

from hpclaunch.basics import states
from hpclaunch.basics.states import (
    ACTIVE,
    EXIT_CANCELLED,
    EXIT_INTERRUPTED,
    SLURM_STATES,
    STREAMING,
    TERMINAL,
    State,
    exit_code_for,
    is_active,
    is_open,
    is_streaming,
    parse,
)

MAN_DIR = Path("/usr/share/man/man1")
PAGES = ("squeue", "sacct")
# Job-state flags Slurm 22.05's libslurm prints (its state strings with flags, e.g.
# `PENDING,POWER_UP_NODE`) that neither page documents; the table keeps them so that a job
# in them is waited for instead of being taken for ended.
UNDOCUMENTED_FLAGS = frozenset({"POWER_UP_NODE", "UPDATE_DB"})
HPCLAUNCH_OWN = frozenset({State.CREATED, State.UNKNOWN})

_FONT = re.compile(r"\\f(?:\(..|\[[^]]*\]|.)")  # \fB \fR \f3 \fP \f(CW \f[B]
_SECTION = re.compile(r'^\.SH\s+"?JOB STATE CODES"?\s*$')
_ENTRY = re.compile(r"^(?:(?P<short>[A-Z]{1,3})\s+)?(?P<name>[A-Z][A-Z_]*[A-Z])$")


def _roff_text(line: str) -> str:
    return _FONT.sub("", line).replace("\\-", "-").replace("\\&", "").strip()


def documented_states(roff: str) -> dict[str, Optional[str]]:
    """{state name: short code or None} from a page's JOB STATE CODES section: each state
    is the tag line of a `.TP` paragraph, `\\fBCA  CANCELLED\\fR` or just `NAME`."""
    lines = roff.splitlines()
    start = next((i for i, line in enumerate(lines) if _SECTION.match(line)), None)
    if start is None:
        return {}
    found: dict[str, Optional[str]] = {}
    for i in range(start + 1, len(lines) - 1):
        if lines[i].startswith(".SH"):
            break
        if lines[i].split()[:1] != [".TP"]:
            continue
        tag = _roff_text(lines[i + 1])
        m = _ENTRY.match(tag)
        assert m is not None, f"unexpected tag line in JOB STATE CODES: {lines[i + 1]!r}"
        assert m["name"] not in found, f"{m['name']} documented twice"
        found[m["name"]] = m["short"]
    return found


def read_page(name: str) -> dict[str, Optional[str]]:
    path = MAN_DIR / f"{name}.1.gz"
    if not path.is_file():
        pytest.skip(f"{path} is missing: install Slurm's client (slurm-client) for its man pages")
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        documented = documented_states(f.read())
    assert documented, f"no JOB STATE CODES section parsed from {path}"
    return documented


@pytest.fixture(params=PAGES)
def page(request: pytest.FixtureRequest) -> tuple[str, dict[str, Optional[str]]]:
    name: str = request.param
    return name, read_page(name)


# --- the table against the man pages ---------------------------------------------------


def test_every_documented_state_has_exactly_one_row(
    page: tuple[str, dict[str, Optional[str]]],
) -> None:
    name, documented = page
    for state_name, short in documented.items():
        rows = [row for row in SLURM_STATES if row.state.value == state_name]
        assert len(rows) == 1, f"{name}(1) documents {state_name}: {len(rows)} rows"
        assert parse(state_name) is rows[0].state
        if short is not None:
            by_short = [row for row in SLURM_STATES if row.short == short]
            assert by_short == rows, f"{name}(1): {short} is {state_name}"
            assert parse(short) is rows[0].state


def test_table_has_no_state_the_pages_do_not_document() -> None:
    documented: dict[str, set[Optional[str]]] = {}
    for name in PAGES:
        for state_name, short in read_page(name).items():
            documented.setdefault(state_name, set()).add(short)
    for state_name, shorts in documented.items():
        assert len(shorts - {None}) <= 1, f"the pages disagree on {state_name}'s code"
    for row in SLURM_STATES:
        name = row.state.value
        if name in UNDOCUMENTED_FLAGS:
            assert row.short is None
            continue
        assert name in documented, f"{name}: in the table, in neither man page"
        if row.short is not None:
            assert row.short in documented[name], f"{name}: the pages give no {row.short}"
    # The enum is the table plus hpclaunch's own two states, nothing else.
    assert set(State) == {row.state for row in SLURM_STATES} | HPCLAUNCH_OWN


def test_documented_states_parser_on_both_roff_styles() -> None:
    roff = "\n".join(
        [
            ".SH OPTIONS",
            ".TP",
            "\\fBXX  NOT_A_STATE\\fR",
            '.SH "JOB STATE CODES"',
            "Text with .TP inside is no entry.",
            ".TP 20",
            "\\fBBF  BOOT_FAIL\\fR",
            "Job terminated.",
            ".IP",
            "",
            ".TP",
            "\\f3OOM OUT_OF_MEMORY\\fP",
            ".TP",
            "\\fBNEW_STATE\\fR",
            ".SH PERFORMANCE",
            ".TP",
            "\\fBZZ  AFTER\\fR",
        ]
    )
    assert documented_states(roff) == {
        "BOOT_FAIL": "BF",
        "OUT_OF_MEMORY": "OOM",
        "NEW_STATE": None,
    }
    assert documented_states(".SH NAME\nsqueue\n") == {}


# --- the table's own consistency -------------------------------------------------------


def test_table_rows_are_unique_and_consistent() -> None:
    names = [row.state for row in SLURM_STATES]
    assert len(names) == len(set(names))
    shorts = [row.short for row in SLURM_STATES if row.short is not None]
    assert len(shorts) == len(set(shorts))
    assert not set(shorts) & {s.value for s in State}  # a code is never also a name
    assert set(names) == ACTIVE | TERMINAL and not ACTIVE & TERMINAL
    assert {State.RUNNING, State.COMPLETING, State.SIGNALING, State.STAGE_OUT} == STREAMING
    assert STREAMING <= ACTIVE
    for row in SLURM_STATES:
        if row.active:
            assert row.exit_code is None, row.state
        elif row.state not in (State.COMPLETED, State.FAILED):
            assert row.exit_code is not None, row.state  # the ranks decide only these two


def test_exit_codes_of_run_wait() -> None:
    # docs/internals.md: "Exit codes of `hpclaunch run --wait`".
    assert {s: exit_code_for(s) for s in TERMINAL if exit_code_for(s) is not None} == {
        State.CANCELLED: 143,
        State.NODE_FAIL: 122,
        State.OUT_OF_MEMORY: 123,
        State.TIMEOUT: 124,
        State.BOOT_FAIL: 125,
        State.DEADLINE: 125,
        State.PREEMPTED: 125,
        State.REVOKED: 125,
        State.SPECIAL_EXIT: 125,
    }
    assert (states.EXIT_UNKNOWN, states.EXIT_OTHER_FAILURE) == (120, 125)
    for s in (State.COMPLETED, State.FAILED, State.RUNNING, State.CREATED, State.UNKNOWN):
        assert exit_code_for(s) is None
    assert exit_code_for("CANCELLED by 1000") == 143 and exit_code_for("to") == 124


def test_local_backend_states_are_in_the_table() -> None:
    for name in ("RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
        assert parse(name).value == name and parse(name) in ACTIVE | TERMINAL


# --- parse -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CANCELLED", State.CANCELLED),
        ("CANCELLED by 1000", State.CANCELLED),
        ("CANCELLED+", State.CANCELLED),
        ("  cancelled by 0 ", State.CANCELLED),
        ("CA", State.CANCELLED),
        ("ca", State.CANCELLED),
        ("PD", State.PENDING),
        ("R", State.RUNNING),
        ("running", State.RUNNING),
        ("OOM", State.OUT_OF_MEMORY),
        ("out_of_memory", State.OUT_OF_MEMORY),
        ("S", State.SUSPENDED),
        ("SE", State.SPECIAL_EXIT),
        ("NODE_FAIL\n", State.NODE_FAIL),
        ("CREATED", State.CREATED),
        ("UNKNOWN", State.UNKNOWN),
        ("", State.UNKNOWN),
        ("   ", State.UNKNOWN),
        ("+", State.UNKNOWN),
        ("SOMETHING_NEW", State.UNKNOWN),
        ("EXPEDITING", State.UNKNOWN),  # newer than Slurm 22.05: not in the table
        ("RUNNINGX", State.UNKNOWN),
        ("XX", State.UNKNOWN),
        ("by CANCELLED", State.UNKNOWN),  # only the first word counts
        # A state with its flags, as libslurm writes the complete state.
        ("PENDING,POWER_UP_NODE", State.PENDING),
        ("RUNNING,UPDATE_DB", State.RUNNING),
        ("CANCELLED,COMPLETING", State.COMPLETING),  # ended, but still completing
        ("COMPLETED,SOMETHING_NEW", State.COMPLETED),
        ("SOMETHING_NEW,REQUEUED", State.REQUEUED),
        ("FAILED,", State.FAILED),
    ],
)
def test_parse(text: str, expected: State) -> None:
    assert parse(text) is expected


def test_parse_every_name_and_code_round_trips() -> None:
    for s in State:
        assert parse(s) is s and parse(s.value) is s and parse(s.value.lower()) is s
        assert parse(s.value + "+") is s
    for row in SLURM_STATES:
        if row.short is not None:
            assert parse(row.short) is row.state


def test_state_is_a_plain_string_outside() -> None:
    assert State.RUNNING == "RUNNING" and isinstance(State.RUNNING, str)
    assert str(State.OUT_OF_MEMORY) == f"{State.OUT_OF_MEMORY}" == "OUT_OF_MEMORY"
    assert json.dumps({"state": State.CANCELLED}) == '{"state": "CANCELLED"}'
    assert State("TIMEOUT") is State.TIMEOUT


def test_is_active_and_is_streaming() -> None:
    assert is_active("PENDING") and is_active("PD") and is_active(State.REQUEUE_HOLD)
    assert is_active("POWER_UP_NODE") and is_active("CANCELLED,COMPLETING")
    assert not is_active("COMPLETED") and not is_active("CANCELLED by 1000")
    assert not is_active("CREATED") and not is_active("UNKNOWN") and not is_active("huh")
    assert is_streaming("RUNNING") and is_streaming("CG") and is_streaming("STAGE_OUT")
    assert not is_streaming("PENDING") and not is_streaming("SUSPENDED")
    assert not is_streaming("COMPLETED") and not is_streaming("")


def test_is_open_is_active_or_created() -> None:
    """A record not ended yet: any active state, and CREATED (written, not yet answered by
    the backend). tracking, sweeps/pointstate, gpu_top, `top` and the --after reasons
    each had their own test; gpu_top, `top` and why_never_started took CREATED as ended."""
    for s in State:
        assert is_open(s) == (s in ACTIVE or s is State.CREATED), s
        assert is_open(s.value.lower()) == is_open(s)
    assert is_open("CREATED") and is_open("PD") and is_open("CANCELLED,COMPLETING")
    assert not is_open("UNKNOWN") and not is_open("") and not is_open("CANCELLED by 0")


def test_the_documented_exit_codes_by_cause_are_the_recorded_ones() -> None:
    # docs/internals.md "Exit codes of ended runs, by cause": each row's state and code
    # are what the code records (local rows: tests/test_local_hardening.py).
    text = (Path(__file__).parents[1] / "docs" / "internals.md").read_text()
    table = text.split("### Exit codes of ended runs, by cause")[1].split("\n\n")[2]
    rows = [line.split("|")[1:4] for line in table.splitlines()[2:]]
    found = {cause.strip(): (state.strip(), code.strip()) for cause, state, code in rows}
    assert found["`hpclaunch cancel`, `sweep cancel`, scancel"] == ("CANCELLED", "143")
    assert found["Ctrl-C (SIGINT) to a local run in the foreground"] == ("CANCELLED", "130")
    assert found["the time limit"] == ("TIMEOUT", "124")
    assert found["a node failed"] == ("NODE_FAIL", "122")
    for cause in ("`hpclaunch cancel`, `sweep cancel`, scancel", "the time limit", "a node failed"):
        state, code = found[cause]  # Slurm's state decides these: the same code locally
        assert exit_code_for(state) == int(code)
    assert exit_code_for("CANCELLED") == EXIT_CANCELLED == 128 + signal.SIGTERM
    assert EXIT_INTERRUPTED == 128 + signal.SIGINT


def _codes_of(table: str) -> set[int]:
    """The exit codes a markdown table's first column names ('143 / 129' gives both)."""
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| ")]
    return {int(code) for row in rows for code in re.findall(r"\b\d+\b", row)}


def test_every_table_of_exit_codes_gives_every_cause_its_code() -> None:
    # One table of exit codes (issue 29): the by-cause codes (cancel, Ctrl-C, SIGTERM,
    # SIGHUP, time limit, node failure) are in every table a reader may land on, the
    # README's and docs/internals.md's `run --wait` one, not only in the by-cause table.
    repo = Path(__file__).parents[1]
    internals = (repo / "docs" / "internals.md").read_text()
    by_cause = internals.split("### Exit codes of ended runs, by cause")[1].split("\n\n")[2]
    causes = {int(c) for row in by_cause.splitlines()[2:] for c in row.split("|")[3].split("/")}
    assert causes == {143, 130, 129, 124, 122}, causes
    run_wait = internals.split("## Exit codes of `hpclaunch run --wait`")[1].split("\n### ")[0]
    readme = (repo / "README.md").read_text()
    readme_table = readme.split("### Exit codes of `run --wait` and of local runs")[1]
    readme_table = readme_table.split("\n\n| code")[1].split("\n\n")[0]
    assert causes <= _codes_of(run_wait), sorted(causes - _codes_of(run_wait))
    assert causes <= _codes_of(readme_table), sorted(causes - _codes_of(readme_table))
