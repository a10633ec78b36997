"""What writing a sweep's point folders costs the file system (issue 26, Performance:
a held 1,000-point sweep to its id). Behaviour, not timing: no mkdir that fails and is
retried."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from hpclaunch.cli.main import main


def _sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, points: int) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith(("SLURM", "HPCLAUNCH"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    values = ",".join(str(i) for i in range(points))
    argv = ["sweep", "--cluster", "local", "--grid", f"x={values}", "--", sys.executable]
    with pytest.raises(SystemExit) as done:
        main([*argv, "-c", "pass", "{x}"])
    assert done.value.code in (0, None)
    return next((tmp_path / "runs" / "default").iterdir())


def test_point_folders_are_made_without_failed_mkdirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """logs/ with parents=True first failed (no point folder yet): a fourth mkdir and a
    Python exception per point."""
    failed: list[Any] = []
    real = os.mkdir

    def counting(path: Any, *args: Any, **kwargs: Any) -> None:
        try:
            real(path, *args, **kwargs)
        except FileNotFoundError:
            failed.append(path)
            raise

    monkeypatch.setattr(os, "mkdir", counting)
    sweep_dir = _sweep(tmp_path, monkeypatch, 5)
    points = sorted((sweep_dir / "points").iterdir())
    assert len(points) == 5
    for point in points:
        assert (point / "logs").is_dir() and (point / "checkpoints").is_dir()
        assert (point / "job.sh").is_file() and (point / "params.env").is_file()
    assert [p for p in failed if "points" in str(p)] == []
