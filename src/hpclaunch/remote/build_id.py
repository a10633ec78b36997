"""Which hpclaunch this is, to the byte: a hash of the installed package's files.

The laptop and the cluster compute it the same way over their own installed files, so
two installs match only when every file matches (a version string alone would let an
edited or older copy through). Standard library only: the remote side computes it on
every call, before anything else is imported.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
SKIP_DIRS = frozenset({"__pycache__"})


def package_files(root: Path = PACKAGE) -> list[str]:
    """Posix paths relative to the package folder, sorted: what a wheel of it holds."""
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        rel = Path(folder).relative_to(root)
        found += [(rel / name).as_posix() for name in files if not name.endswith(".pyc")]
    return sorted(found)


@functools.cache  # once a process: every request carries it
def fingerprint(root: Path = PACKAGE) -> str:
    """sha256 over every file's path and bytes; the first 16 hex digits. Remembered
    in the environment's prefix (the venv) for as long as no file's size or mtime
    changes (a stat of each file is a third of the cost of reading them all)."""
    files = package_files(root)
    stamp = _stamp(root, files)
    cache = Path(sys.prefix) / "hpclaunch-build-id"
    try:
        known, build = cache.read_text().split()
        if known == stamp:
            return build
    except (OSError, ValueError):
        pass
    build = _digest(root, files)
    with contextlib.suppress(OSError):  # a read-only install: computed each time
        cache.write_text(f"{stamp} {build}\n")
    return build


def _stamp(root: Path, files: list[str]) -> str:
    import hashlib  # here: only a remote command needs it

    digest = hashlib.sha256()
    for rel in files:
        info = os.stat(root / rel)
        digest.update(f"{rel}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:32]


def _digest(root: Path, files: list[str]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for rel in files:
        digest.update(rel.encode() + b"\0")
        digest.update((root / rel).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]
