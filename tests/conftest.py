"""Shared fixtures: the Slurm testbed and a folder + environment for its unprivileged user."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import testbed

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
PROGRAMS = Path(__file__).parent / "programs"


@dataclass
class Hpc:
    """Runs `hpclaunch` (and other commands) as the testbed's unprivileged user."""

    cwd: Path
    env: dict[str, str]

    def run(
        self,
        *args: str,
        timeout: float = 180,
        env: dict[str, str] | None = None,
        check_user_error: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        return self.cmd(["hpclaunch", *args], timeout=timeout, env=env)

    def cmd(
        self, argv: list[str], timeout: float = 180, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        environment = {**self.env, **(env or {})}
        return subprocess.run(
            ["runuser", "-u", testbed.USER, "--", *argv],
            cwd=self.cwd,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def folder(self, name: str) -> Path:
        """A new folder under cwd that the test user owns (the ranks write into it)."""
        path = self.cwd / name
        path.mkdir(parents=True)
        info = self.cwd.stat()
        os.chown(path, info.st_uid, info.st_gid)
        return path

    def runs(self) -> list[dict[str, Any]]:
        index = Path(self.env["XDG_DATA_HOME"]) / "hpclaunch" / "runs.jsonl"
        if not index.exists():
            return []
        return [json.loads(line) for line in index.read_text().splitlines()]

    def run_dirs(self) -> list[Path]:
        root = self.cwd / "runs"
        return sorted(p for p in root.glob("*/*") if p.is_dir()) if root.exists() else []


@pytest.fixture(scope="session")
def slurm_conf() -> Path:
    reason = testbed.skip_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"the Slurm testbed is required in CI: {reason}")
        pytest.skip(reason)
    conf = testbed.slurm_conf()
    assert conf is not None
    return conf


@pytest.fixture
def hpc(slurm_conf: Path) -> Iterator[Hpc]:
    """A fresh folder in the shared file system, owned by the test user, as cwd."""
    user = pwd.getpwnam(testbed.USER)
    folder = testbed.work_dir() / f"t-{uuid.uuid4().hex[:10]}"
    folder.mkdir(parents=True)
    (folder / "xdg").mkdir()
    for path in (folder, folder / "xdg"):
        os.chown(path, user.pw_uid, user.pw_gid)
    env = {
        "PATH": f"{VENV_BIN}:{testbed.USER_PATH}",
        "SLURM_CONF": str(slurm_conf),
        "HOME": user.pw_dir,
        "USER": testbed.USER,
        "LOGNAME": testbed.USER,
        "LANG": "C.UTF-8",
        "XDG_DATA_HOME": str(folder / "xdg"),
        "XDG_CONFIG_HOME": str(folder / "xdg"),
        "HPCLAUNCH_CLUSTER": "slurm",
    }
    yield Hpc(cwd=folder, env=env)
    testbed.wait_idle(timeout=60)
    shutil.rmtree(folder, ignore_errors=True)


def load_json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
