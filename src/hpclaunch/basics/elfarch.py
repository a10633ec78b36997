"""The CPU a Linux executable is built for, read from its ELF header.

A binary hpclaunch ships to the compute nodes (py-spy, for --profiler py-spy) must match
their CPUs: an x86_64 py-spy on Alps' aarch64 nodes fails there only when the rank
starts, after the queue. The header's e_machine field says which CPU it is for
(System V ABI, "ELF Header": e_machine at byte 18, EM_X86_64 = 62, EM_AARCH64 = 183;
https://refspecs.linuxfoundation.org/elf/gabi4+/ch4.eheader.html).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

_MAGIC = b"\x7fELF"
_MACHINES = {62: "x86_64", 183: "aarch64"}


def machine_of(path: Path) -> Optional[str]:
    """'x86_64', 'aarch64', another machine's number as text, or None when the file is
    not an ELF executable (a script, unreadable): then nothing can be said of it."""
    try:
        with open(path, "rb") as file:
            header = file.read(20)
    except OSError:
        return None
    if len(header) < 20 or header[:4] != _MAGIC or header[5] not in (1, 2):
        return None
    field = header[18:20]  # EI_DATA (byte 5): 1 = least significant byte first, 2 = most
    number = int.from_bytes(field, "little") if header[5] == 1 else int.from_bytes(field, "big")
    return _MACHINES.get(number, f"ELF machine {number}")
