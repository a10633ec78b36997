"""Issue 29 (what a person sees): the summary line that ends `run --wait`, `logs --follow`
and a local sweep shows its state in colour (FAILED red, COMPLETED green) where it goes to a
terminal, never under NO_COLOR or into a pipe."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from builders import local_env

PY = sys.executable
RED, GREEN = "\x1b[31mFAILED", "\x1b[32mCOMPLETED"


def _on_terminal(cwd: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    """hpclaunch with its stderr on a pseudo-terminal: (exit code, what the terminal got)."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [PY, "-m", "hpclaunch", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=child,
    )  # fmt: skip
    os.close(child)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(main)
    return proc.wait(timeout=120), shown.decode(errors="replace")


@pytest.mark.parametrize("no_color", [False, True])
def test_the_summary_line_is_in_colour_on_a_terminal_only(tmp_path: Path, no_color: bool) -> None:
    env = local_env(tmp_path)
    env.pop("NO_COLOR", None)
    if no_color:
        env["NO_COLOR"] = "1"
    code, shown = _on_terminal(tmp_path, env, "run", "--", PY, "-c", "raise SystemExit(3)")
    assert code == 3, shown
    assert "hpclaunch: run " in shown and "FAILED" in shown, shown
    assert (RED in shown) == (not no_color), shown
    code, shown = _on_terminal(tmp_path, env, "logs", "--follow")
    assert code == 3 and (RED in shown) == (not no_color), shown
    code, shown = _on_terminal(tmp_path, env, "run", "--", PY, "-c", "pass")
    assert code == 0 and (GREEN in shown) == (not no_color), shown
    piped = subprocess.run(
        [PY, "-m", "hpclaunch", "run", "--", PY, "-c", "raise SystemExit(3)"], cwd=tmp_path,
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert piped.returncode == 3 and "FAILED" in piped.stderr and "\x1b[" not in piped.stderr
