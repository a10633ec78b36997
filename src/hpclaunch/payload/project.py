"""Git facts about the user's project, in one place: its root, name, commit, dirtiness.

Every git call runs with argv lists and `--no-optional-locks`, so hpclaunch never blocks
the user's own git (an index refresh would otherwise take .git/index.lock).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

GIT_TIMEOUT = 60  # seconds; ls-files walks untracked folders, slow on a cold network file system


def git(
    cwd: Path,
    args: list[str],
    timeout: float = GIT_TIMEOUT,
    extra_env: Optional[Mapping[str, str]] = None,
) -> subprocess.CompletedProcess[bytes]:
    """Bytes, not text: paths may be any bytes. extra_env: added to this process's."""
    env = None
    if extra_env:
        from hpclaunch.basics.environ import environment

        env = {**environment(), **extra_env}
    return subprocess.run(
        ["git", "--no-optional-locks", "-c", "core.quotepath=off", *args],
        cwd=cwd,
        capture_output=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def git_root(cwd: Path) -> Optional[Path]:
    """The git top level holding cwd; None outside git or when git is missing."""
    try:
        out = git(cwd, ["rev-parse", "--show-toplevel"], timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    top = os.fsdecode(out.stdout).rstrip("\n")  # only the newline: a name may end in spaces
    return Path(top) if out.returncode == 0 and top else None


def root(cwd: Path) -> Path:
    """The git top-level folder (found without running git: this is on the fast path),
    else cwd."""
    for folder in (cwd, *cwd.parents):
        if (folder / ".git").exists():
            return folder
    return cwd


def name(cwd: Path) -> str:
    """The git top-level folder's name, else cwd's name."""
    return root(cwd).name or "project"


def git_status(cwd: Path) -> Optional[tuple[str, bool]]:
    """(HEAD's commit, "" before the first commit; whether tracked files differ from it,
    staged or not) from ONE `git status --porcelain=v2 --branch` call; None outside git
    or on a git error. --no-optional-locks (see `git`) keeps status from refreshing the
    user's index (https://git-scm.com/docs/git-status, "BACKGROUND REFRESH")."""
    args = ["status", "--porcelain=v2", "--branch", "--untracked-files=no"]
    try:
        out = git(cwd, args, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    commit, dirty = "", False
    for line in os.fsdecode(out.stdout).splitlines():
        if line.startswith("# branch.oid "):
            oid = line[len("# branch.oid ") :].strip()
            commit = "" if oid == "(initial)" else oid
        elif line and not line.startswith("#"):  # 1/2/u: a changed or unmerged entry
            dirty = True
    return commit, dirty


def git_state(cwd: Path) -> dict[str, Any]:
    """Commit and dirtiness (a boolean) of the project, recorded with the run; empty
    outside git or before the first commit."""
    found = git_status(cwd)
    if found is None or not found[0]:
        return {}
    return {"commit": found[0], "dirty": found[1]}
