"""The Slurm testbed as the bench/ scripts use it: commands, the clients pointed at it,
the default partition, waiting for an idle cluster. Shared by the scripts that submit
jobs (imported as `cluster`; bench/ is on sys.path when a script in it runs)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

TESTBED_CONF = (
    Path(os.environ.get("HPCLAUNCH_TESTBED_STATE", "/var/tmp/hpclaunch-testbed")) / "slurm.conf"
)
PY = sys.executable  # the real interpreter, not a pyenv shim (shims cost ~50 ms per start)
BINDIR = Path(PY).parent
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def sh(argv: Sequence[str], **kw: Any) -> str:
    """Run a command (no shell), return stdout; raise with its stderr on failure."""
    p = subprocess.run(list(argv), capture_output=True, text=True, check=False, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {p.returncode}: {p.stderr.strip()[-500:]}")
    return str(p.stdout)


def ensure_cluster(unset: Iterable[str] = RANK_VARS) -> None:
    """Point the Slurm clients at the running testbed (SLURM_CONF, else the testbed's
    own file; the harness never starts one), put the real interpreter's bin first on
    PATH (jobs inherit it: --export=ALL) and drop `unset` from the environment (rank
    variables of our own would reach the jobs)."""
    if not os.environ.get("SLURM_CONF"):
        if not TESTBED_CONF.exists():
            raise SystemExit(
                "SLURM_CONF is unset and the testbed is not up: "
                'export "$(sudo bash testbed/up.sh | tail -n 1)"'
            )
        os.environ["SLURM_CONF"] = str(TESTBED_CONF)
    os.environ["PATH"] = f"{BINDIR}{os.pathsep}{os.environ['PATH']}"
    for var in unset:
        os.environ.pop(var, None)
    sh(["sinfo", "-h", "-o", "%P"])  # fails early when no controller answers


def default_partition() -> str:
    parts = sh(["sinfo", "-h", "-o", "%P"]).split()
    star = [p for p in parts if p.endswith("*")]
    return (star or parts)[0].rstrip("*")


def queue(env: Mapping[str, str] | None = None) -> list[str]:
    """The job ids slurmctld lists now (all users)."""
    return sh(["squeue", "-h", "-o", "%i"], env=env).split()


def wait_idle(timeout: float, poll: float = 0.1, env: Mapping[str, str] | None = None) -> None:
    """Block until no job is queued and every node is idle: each rep starts alike."""
    deadline = time.monotonic() + timeout
    while True:
        queued = queue(env)
        states = sh(["sinfo", "-h", "-N", "-o", "%N %t"], env=env).split()[1::2]
        if not queued and states and all(s == "idle" for s in states):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"cluster not idle after {timeout:.0f} s: queue={queued} nodes={states}"
            )
        time.sleep(poll)
