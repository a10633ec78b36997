"""The ONE place that produces shell text. Every value that reaches a script passes here.

User values are always single-quoted (shlex.quote). Profile values may reference
environment variables as `$NAME` or `${NAME}` (e.g. `/tmp/$USER-miopen-cache-$SLURM_JOB_ID`);
`template()` turns those into double-quoted text in which only those references expand.
Nothing here ever produces `eval`, command substitution from user text, or unquoted words.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Union

from hpclaunch.errors import UserError, show

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NEEDS_ANSI_C = re.compile(r"[\x01-\x1f\x7f\ud800-\udfff]")
_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def quote(value: str) -> str:
    """One bash word holding exactly `value` (any bytes but NUL, newlines included).

    Plain text is single-quoted. Text with control characters or bytes that are not
    UTF-8 (surrogate-escaped) uses bash's $'...' with \\xHH escapes, so the script holds
    only printable text: sbatch refuses a script with a carriage return in it.
    """
    if "\x00" in value:
        raise UserError("argument", f"{show(value)} holds a NUL byte", "", "Remove it")
    if not _NEEDS_ANSI_C.search(value):
        return shlex.quote(value)
    out = ["$'"]
    for char in value:
        code = ord(char)
        if char in "\\'":
            out.append("\\" + char)
        elif 0xDC80 <= code <= 0xDCFF:  # a raw byte, surrogate-escaped by Python
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            raise UserError("argument", f"{show(value)} is not encodable text", "", "Fix it")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        else:
            out.append(char)
    out.append("'")
    return "".join(out)


def check_name(name: str, field: str = "--env") -> str:
    if not _NAME.match(name):
        raise UserError(
            field,
            f"{show(name)} is not a valid environment variable name",
            "letters, digits and _, not starting with a digit",
            "Rename the variable",
        )
    return name


# NamedTuples, not dataclasses: a command forwarded to a cluster quotes with this module,
# and dataclasses would cost that fast path its import (6 ms).
class Var(NamedTuple):
    """A reference to a shell variable, expanded when the script runs: "$NAME"."""

    name: str


class Template(NamedTuple):
    """Trusted profile text in which `$NAME`/`${NAME}` expand and nothing else does."""

    text: str


class Join(NamedTuple):
    """One shell word made of parts side by side: "${HPCLAUNCH_LOCAL}"'/data/my file'."""

    parts: tuple[Union[str, Var, Template], ...]


Word = Union[str, Var, Template, Join]


def template(text: str) -> str:
    """Double-quoted shell text where only `$NAME` / `${NAME}` references expand."""
    out = ['"']
    pos = 0
    for match in _REF.finditer(text):
        out.append(_dq_escape(text[pos : match.start()]))
        out.append("${" + (match.group(1) or match.group(2)) + "}")
        pos = match.end()
    out.append(_dq_escape(text[pos:]))
    out.append('"')
    return "".join(out)


def expand(item: Word, values: Mapping[str, str]) -> str:
    """A word as the shell would expand it, for backends that start processes without
    a shell (local): Var and Template references come from `values`, never from text."""
    if isinstance(item, Var):
        return values.get(item.name, "")
    if isinstance(item, Template):
        return _REF.sub(lambda m: values.get(m.group(1) or m.group(2), ""), item.text)
    if isinstance(item, Join):
        return "".join(expand(part, values) for part in item.parts)
    return item


def _dq_escape(text: str) -> str:
    if "\x00" in text:
        raise UserError("profile", f"{show(text)} holds a NUL byte", "", "Remove it")
    return re.sub(r'([\\"$`])', r"\\\1", text)


def word(item: Word) -> str:
    """Render one argv element."""
    if isinstance(item, Var):
        return '"${' + check_name(item.name, "variable") + '}"'
    if isinstance(item, Template):
        return template(item.text)
    if isinstance(item, Join):
        return "".join(word(part) for part in item.parts) or "''"
    return quote(item)


def command(argv: Sequence[Word]) -> str:
    """A command line, every word quoted."""
    return " ".join(word(a) for a in argv)


def join_multiline(head: Sequence[Word], tail: Sequence[Word]) -> str:
    """`head[0]` with one option per line, then the command `tail` on its own line:
    a readable preview that is still exactly one shell command."""
    lines_ = [word(head[0])] + ["    " + word(a) for a in head[1:]]
    if tail:
        lines_.append("    " + command(tail))
    return " \\\n".join(lines_)


def export(name: str, value: Word) -> str:
    return f"export {check_name(name)}={word(value)}"


def export_default(name: str, value: Word) -> str:
    """Export only when the variable is not already set (user's own value wins)."""
    check_name(name)
    return f'export {name}="${{{name}-}}"; [ -n "${{{name}}}" ] || export {name}={word(value)}'


def unset(name: str) -> str:
    return f"unset {check_name(name)}"


def sbatch_line(option: str, value: str | None = None) -> str:
    """`#SBATCH --option=value`. Slurm reads these lines raw: no quoting is possible, so a
    value with a newline or a character Slurm would misread is refused, not escaped."""
    if value is None:
        return f"#SBATCH {option}"
    if any(c in value for c in "\n\r\x00"):
        raise UserError(option, f"{show(value)} holds a line break", "", "Remove it")
    if any(c.isspace() for c in value) or "'" in value:
        # sbatch splits #SBATCH lines on blanks but keeps double-quoted text together.
        if '"' in value or "\\" in value:
            raise UserError(option, f"{show(value)} mixes blanks and quotes", "", "Drop the quotes")
        value = f'"{value}"'
    return f"#SBATCH {option}={value}"


def comment(text: str) -> str:
    return "# " + text.replace("\n", " ").replace("\r", " ")


def lines(items: Iterable[str]) -> str:
    return "\n".join(items) + "\n"


# What a local run's --setup lines are run as (backends/local.py): the lines as the batch
# script would run them, then the environment they leave, after a marker line.
SETUP_MARK = b"\n--- hpclaunch: environment after --setup ---\n"


def setup_probe(lines: Sequence[str]) -> str:
    """The --setup lines (the user's shell text, run as typed, as in the batch script,
    stopped at the first failure), then the marker and `env -0`."""
    mark = SETUP_MARK.decode()
    return "\n".join(["set -e", *lines, f"printf '%s' {quote(mark)}", "env -0"]) + "\n"


def setup_failed_trap(events: str) -> list[str]:
    """Before a batch script's --setup lines: when one fails (set -e ends the shell there),
    a setup_failed event goes to events.jsonl, so the run's record says why it FAILED.
    Bash builtins only; `setup_trap_off` ends it after the lines."""
    fields = '{"event":"setup_failed","exit_code":%d,"time":%s}\\n'
    return [
        "hpclaunch_setup_failed() {  # the EXIT trap while the --setup lines run",
        "    local rc=$? now",
        '    [ "$rc" -ne 0 ] || return 0',
        "    printf -v now '%(%s)T' -1",
        "    now=${EPOCHREALTIME:-$now}",
        f'    printf \'{fields}\' "$rc" "${{now/,/.}}" >>{quote(events)}',
        "}",
        "trap hpclaunch_setup_failed EXIT",
    ]


def setup_trap_off() -> str:
    return "trap - EXIT"
