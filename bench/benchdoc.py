"""One harness's section of docs/benchmarks.md, replaced between its two markers (or
appended), so each harness rewrites only what it measured."""

from __future__ import annotations

from pathlib import Path

HEADER = (
    "# Benchmarks\n\nMeasured figures of hpclaunch against its targets; each section is "
    "written by the harness named in it.\n"
)


def write_section(doc: Path, start: str, end: str, section: str) -> None:
    text = doc.read_text() if doc.exists() else HEADER
    if start in text and end in text:
        pre, rest = text.split(start, 1)
        text = pre + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
