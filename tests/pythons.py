"""Other Python interpreters on this machine, for the tests that run code on the oldest
Python it promises (the in-job code: 3.6 on LUMI's nodes, 3.8; the CLI: 3.9)."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
from typing import Optional


@functools.cache
def python_of(version: str, needs: str = "") -> Optional[str]:
    """An interpreter of exactly VERSION ("3.8") that runs here (and imports NEEDS, a
    comma-separated module list), or None.

    pyenv's own installs come first and its shims are skipped: a shim of a version the
    shell has not selected runs pyenv's bash (~0.3 s) only to fail, and the test modules
    that ask are imported by every pytest worker.
    """
    name = f"python{version}"
    pyenv = os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/{name}")
    found = [*sorted(glob.glob(pyenv)), shutil.which(name) or ""]
    code = f"import {needs}" if needs else "pass"
    for candidate in found:
        if not candidate or f"{os.sep}.pyenv{os.sep}shims{os.sep}" in candidate:
            continue
        try:
            done = subprocess.run([candidate, "-c", code], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return candidate
    return None
