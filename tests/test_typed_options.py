"""Options are typed once (config.py -> options.RunOptions) and the JobSpec is built once
(validate.Checked.spec with the features' spec.Parts): rules read from the source."""

from __future__ import annotations

import re
from pathlib import Path

from hpclaunch.config.options import OPTIONS

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "hpclaunch"
# The layer that builds the typed options, and the two commands that build a raw
# request for it (as the CLI and the API do): the doctor's run and `rerun`.
RAW_REQUEST = {"config/layering.py", "config/options.py", "doctor/probejob.py", "cli/control.py"}


def _modules() -> dict[str, str]:
    return {
        str(path.relative_to(PACKAGE)): path.read_text(encoding="utf-8")
        for path in sorted(PACKAGE.rglob("*.py"))
        if "node" not in path.relative_to(PACKAGE).parts[:1]
    }


def test_no_string_key_reads_of_options_past_config() -> None:
    dests = "|".join(sorted((opt.dest for opt in OPTIONS), key=len, reverse=True))
    # A mapping of options by the names it goes by (values, options, given, opts).
    read = re.compile(rf"""\b(?:values|options|given|opts)(?:\.get\(|\[)["']({dests})["']""")
    found = [
        f"{name}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0)}"
        for name, text in _modules().items()
        if name not in RAW_REQUEST
        for m in read.finditer(text)
    ]
    assert not found, "string-key reads of run options:\n" + "\n".join(found)


def test_the_jobspec_is_built_once() -> None:
    modules = _modules()
    built = {name: text.count("JobSpec(") for name, text in modules.items()}
    assert {name: n for name, n in built.items() if n} == {"planning/validate.py": 1}
    assert not re.search(
        r"(?<![.\w])replace\(", modules["planning/preparing.py"]
    )  # dataclasses.replace
