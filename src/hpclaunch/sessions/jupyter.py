"""`hpclaunch dev --jupyter`: jupyter_server from the run's own environment (its venv or
image), on the node's loopback, a random port, a random token; reached through the relay.

jupyter_server reads its token from $JUPYTER_TOKEN (IdentityProvider.token's default,
https://jupyter-server.readthedocs.io/en/latest/other/full-config.html), so the token is
never on a command line another user could read in ps."""

from __future__ import annotations

import secrets
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from hpclaunch.errors import UserError

TOKEN_VAR = "JUPYTER_TOKEN"
READY_TIMEOUT_S = 180.0
MISSING = "No module named jupyter_server"


def new_token() -> str:
    return secrets.token_hex(24)


def command(port: int) -> list[str]:
    """The server: the environment's python3 (the venv's first on PATH, as the job's
    tasks have it), loopback only, this port or none, no browser."""
    return [
        "python3",
        "-m",
        "jupyter_server",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.open_browser=False",
    ]


def url(port: int, token: str, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{port}/?token={token}"


def status_code(port: int, token: str) -> int:
    """GET /api/status through the relay's local port: its HTTP status, 0 if none."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/status", headers={"Authorization": f"token {token}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return 0


def wait_ready(
    local_port: int,
    token: str,
    server: subprocess.Popen[bytes],
    log: Path,
    *,
    timeout_s: float = READY_TIMEOUT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Until the server answers through the relay; a server that ended first is one
    line (jupyter_server missing from the environment, or its own last words)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if status_code(local_port, token) == 200:
            return
        if server.poll() is not None:
            raise ended(log)
        sleep(0.5)
    raise UserError(
        "--jupyter",
        f"the server did not answer within {timeout_s:.0f} s",
        "",
        f"See its output in {log}",
    )


def ended(log: Path) -> UserError:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    if MISSING in text:
        return UserError(
            "--jupyter",
            "jupyter_server is not installed in the run's environment",
            "the server runs with the venv's or the image's python3",
            "Install it there: pip install jupyter_server ipykernel (or jupyterlab)",
        )
    said = [line.strip() for line in text.splitlines() if line.strip()][-1:]
    words = f": {said[0][:200]}" if said else ""
    return UserError("--jupyter", f"the server ended{words}", "", f"See {log}")
