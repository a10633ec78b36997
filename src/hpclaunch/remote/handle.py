"""`hpclaunch.run(..., remote="lumi")`: the run started by the cluster's hpclaunch, and
a handle that asks it, over the same multiplexed connection, what `Run` answers from
local files: state, logs, the exit code, the result; and cancels it.

Each question is one remote hpclaunch command (`status --json`, `logs`, `cancel`), so
the scheduler sees exactly what a user at the login node would cause; `wait()` is one
`logs --follow` there (its status calls back off) and then one `status`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from hpclaunch.config.options import BY_NAME
from hpclaunch.errors import HpclaunchError, UserError
from hpclaunch.node import RESULT_JSON
from hpclaunch.remote.forward import (
    SERVE,
    config_forward_env,
    profile_remote,
    project_mirror,
    project_names,
    request,
    sent_environment,
    ship_code,
    used_names,
)
from hpclaunch.remote.ssh import Connection, Host


class RemoteError(HpclaunchError):
    """The cluster's hpclaunch refused or failed a command (its own line)."""


def option_words(options: Mapping[str, Any]) -> list[str]:
    """Typed API options back into `hpclaunch run` words."""
    words: list[str] = []
    by_dest = {opt.dest: opt for opt in BY_NAME.values()}
    for dest, value in options.items():
        opt = by_dest[dest]
        if opt.kind == "flag":
            words += [f"--{opt.name}"] if value else []
        elif opt.kind == "list":
            for item in value:
                words += [f"--{opt.name}", str(item)]
        else:
            words += [f"--{opt.name}", str(value)]
    return words


def call(
    conn: Connection,
    argv: Sequence[str],
    environ: Mapping[str, str],
    names: Sequence[str] = (),
    laptop_cwd: Optional[Path] = None,
    **extra: Any,
) -> subprocess.CompletedProcess[bytes]:
    """One remote hpclaunch command, its output read here; of the laptop's secrets only
    those the command uses cross (forward.used_names, plus `names`). laptop_cwd: the
    project it is for is named there too (forward.project_mirror: `last` is its)."""
    used = used_names(argv, (*names, *config_forward_env(environ)))
    sent = sent_environment(environ, used)
    if laptop_cwd is not None:
        sent.update(project_mirror(laptop_cwd, None, environ))
    header = request(conn, argv, env=sent, **extra)
    return conn.run(list(SERVE), stdin=json.dumps(header).encode() + b"\n")


def _checked(done: subprocess.CompletedProcess[bytes]) -> str:
    if done.returncode != 0:
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise RemoteError(lines[-1] if lines else f"exit code {done.returncode}")
    return done.stdout.decode("utf-8", "replace")


class RemoteRun:
    """A run on a remote cluster: `.id`, `.job_id`, `.run_dir` (the cluster's path),
    `.state`, `.status()`, `.wait()`, `.follow()`, `.logs()`, `.cancel()`, `.result()`."""

    def __init__(self, conn: Connection, environ: Mapping[str, str], started: dict[str, Any]):
        self._conn = conn
        self._environ = dict(environ)
        self.id: str = started["run_id"]
        self.job_id: Optional[str] = started.get("job_id")
        self.run_dir: str = started.get("run_dir", "")
        self._code: Optional[int] = None

    def __repr__(self) -> str:
        return f"RemoteRun({self.id!r}, host={self._conn.host.name!r})"

    def _ask(self, *argv: str) -> str:
        return _checked(call(self._conn.open(), argv, self._environ))

    def status(self) -> dict[str, Any]:
        """What `hpclaunch status RUN --json` says on the cluster."""
        found: dict[str, Any] = json.loads(self._ask("status", self.id, "--json"))
        return found

    @property
    def state(self) -> str:
        return str(self.status()["state"])

    def logs(self, rank: Optional[int] = None, attempt: Optional[int] = None) -> str:
        argv = ["logs", self.id]
        argv += ["--rank", str(rank)] if rank is not None else []
        argv += ["--attempt", str(attempt)] if attempt is not None else []
        return self._ask(*argv)

    def wait(self, timeout: Optional[float] = None) -> int:
        """Block until the run ends; its exit code. TimeoutError after `timeout` s."""
        return self._wait(timeout, stream=False)

    def follow(self) -> int:
        """Stream the ranks' output here until the run ends; its exit code."""
        return self._wait(None, stream=True)

    def _wait(self, timeout: Optional[float], stream: bool) -> int:
        if self._code is None:
            header = request(self._conn.open(), ["logs", self.id, "--follow"])
            payload = json.dumps(header).encode() + b"\n"
            if stream:
                self._conn.stream(SERVE, stdin=payload)
            else:
                try:
                    self._conn.run(list(SERVE), stdin=payload, timeout=timeout)
                except subprocess.TimeoutExpired:
                    raise TimeoutError(f"run {self.id} still running") from None
            code = self.status().get("exit_code")
            self._code = int(code) if code is not None else 120
        return self._code

    def cancel(self) -> None:
        self._ask("cancel", self.id)

    def result(self) -> Any:
        """The JSON value rank 0 wrote to $HPCLAUNCH_RESULT_FILE, or None."""
        done = self._conn.open().run(["cat", "--", f"{self.run_dir}/{RESULT_JSON}"])
        try:
            return json.loads(done.stdout) if done.returncode == 0 else None
        except ValueError:
            return None


def start(
    host: str,
    program: Sequence[str],
    options: Mapping[str, Any],
    cwd: Path,
    environ: Mapping[str, str],
) -> RemoteRun:
    """Ship the code, submit on the cluster, return the handle (nothing printed)."""
    if not program:
        raise UserError("program", "missing", "", "Pass the program to run")
    argv = ["run", *option_words(options), "--json", "--", *program]
    settings = profile_remote(argv, cwd, environ)
    from hpclaunch.basics.units import parse_size

    limit = parse_size(settings.ship_limit, "[remote] ship_limit")
    conn = Connection(Host.parse(host), environ).open()
    shipped = ship_code(conn, cwd, program, limit_bytes=limit)
    names = [*settings.forward_env, *project_names(argv, cwd, environ)]
    done = call(conn, argv, environ, names, laptop_cwd=cwd, cwd=shipped.remote_cwd)
    lines = _checked(done).strip().splitlines()
    if not lines:
        print(done.stderr.decode("utf-8", "replace"), file=sys.stderr)
        raise RemoteError(f"{conn.host.name} started no run")
    return RemoteRun(conn, environ, json.loads(lines[-1]))
