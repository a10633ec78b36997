"""Which --grid names the program's arguments never mention: their values reach the
program only by its environment, which a user who forgot `{lr}` did not mean."""

from __future__ import annotations

import re
from collections.abc import Sequence

from hpclaunch.sweeps.points import PARAM_ENV_PREFIX, Point, parse_grid


def env_only_note(
    program_args: Sequence[str], points: Sequence[Point], grids: Sequence[str]
) -> str:
    """A warning line for --grid names that no argument mentions (no {name} placeholder,
    no word holding the name, as in --lr or lr=..., in any case): their values reach
    the program only as HPCLAUNCH_PARAM_<NAME> in its environment. "" when none."""
    text = "\n".join([*program_args, *(arg for point in points for arg in point.args)])

    def mentioned(name: str) -> bool:  # a whole word (x is not the x of python)
        return re.search(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])", text, re.I) is not None

    unused = [name for name in (parse_grid(g)[0] for g in grids) if not mentioned(name)]
    if not unused:
        return ""
    names = ", ".join(unused)
    variables = ", ".join(PARAM_ENV_PREFIX + name.upper() for name in unused)
    return (
        f"hpclaunch: warning: --grid {names}: in none of the program's arguments, so the "
        f"values reach it only by environment ({variables}); write {{{unused[0]}}} in an "
        "argument to pass them there"
    )
