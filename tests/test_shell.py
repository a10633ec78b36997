"""shell.py is the only producer of shell text: check that bash reads back what it quoted."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpclaunch.basics import shell
from hpclaunch.errors import UserError

_TEXT = st.one_of(
    st.text(alphabet=st.characters(blacklist_characters="\x00", codec="utf-8"), max_size=40),
    st.binary(max_size=12).filter(lambda b: b"\x00" not in b).map(os.fsdecode),
)


def _bash_argv(script: str) -> list[str]:
    """Run `script` followed by a printer of "$@" in bash; return the words bash saw."""
    out = subprocess.run(
        ["bash", "-c", script + ' "$@"', "bash"],
        capture_output=True,
        check=True,
    ).stdout
    return out.decode("utf-8", "surrogateescape").split("\x00")[:-1]


@settings(max_examples=30, deadline=None)
@given(st.lists(_TEXT, min_size=1, max_size=12))
def test_command_words_reach_bash_unchanged(words: list[str]) -> None:
    printer = "printf '%s\\0'"
    script = "set -- " + shell.command(words) + "; " + printer
    assert _bash_argv(script) == words
    # sbatch refuses scripts with carriage returns: the quoted text never holds one.
    assert "\r" not in shell.command(words)


def test_template_expands_only_variable_references() -> None:
    text = 'a $USER ${SLURM_JOB_ID} `id` $(id) "q" \\ end'
    rendered = shell.template(text)
    out = subprocess.run(
        ["bash", "-c", f"printf %s {rendered}"],
        capture_output=True,
        text=True,
        check=True,
        env={"USER": "u1", "SLURM_JOB_ID": "42", "PATH": "/usr/bin:/bin"},
    ).stdout
    assert out == 'a u1 42 `id` $(id) "q" \\ end'


def test_export_default_keeps_users_value() -> None:
    line = shell.export_default("OMP_NUM_THREADS", "7")

    def run(env: dict[str, str]) -> str:
        return subprocess.run(
            ["bash", "-c", line + '; printf %s "$OMP_NUM_THREADS"'],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout

    assert run({"PATH": "/usr/bin:/bin"}) == "7"
    assert run({"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "3"}) == "3"


def test_nul_is_refused() -> None:
    with pytest.raises(UserError):
        shell.quote("a\x00b")


def test_sbatch_line_refuses_newlines_and_quotes_blanks() -> None:
    with pytest.raises(UserError):
        shell.sbatch_line("--job-name", "a\nb")
    assert shell.sbatch_line("--job-name", "my job") == '#SBATCH --job-name="my job"'
    assert shell.sbatch_line("--exclusive") == "#SBATCH --exclusive"


def test_bad_variable_names_are_refused() -> None:
    for name in ("1A", "A-B", "", "A B", "$X"):
        with pytest.raises(UserError):
            shell.export(name, "v")
