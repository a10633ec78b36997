"""What every PNG hpclaunch draws shares (`hpclaunch plot`, `hpclaunch sweep plot`): its
--size in pixels, the DPI that makes it exactly that size, the hint when matplotlib is
missing."""

from __future__ import annotations

import re
from typing import Optional

from hpclaunch.errors import UserError, show

DPI = 100  # with figsize = pixels / DPI the PNG has exactly the requested pixels
DEFAULT_SIZE = (800, 500)
HINT = "hpclaunch: hint: pip install 'hpclaunch[plot]' for a PNG"
_SIZE = re.compile(r"([0-9]{1,5})[xX]([0-9]{1,5})")
_SIZE_RANGE = (50, 10000)  # beyond this matplotlib would allocate gigabytes


def parse_size(text: Optional[str]) -> tuple[int, int]:
    if text is None:
        return DEFAULT_SIZE
    low, high = _SIZE_RANGE
    found = _SIZE.fullmatch(text.strip())
    if not found or not all(low <= int(v) <= high for v in found.groups()):
        raise UserError(
            "--size",
            f"{show(text)} is not WIDTHxHEIGHT in pixels",
            f"{low} to {high} each",
            "Write e.g. --size 800x500",
        )
    return int(found.group(1)), int(found.group(2))
