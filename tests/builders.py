"""Builders the unit tests share (one place instead of a copy per file): a JobSpec validated
as the command line would give it, and the environments of hpclaunch run as a child.

Plain functions and constants (no fixtures), imported as ``builders`` (tests/ is on
sys.path, as for ``testbed``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.options import RunOptions
from hpclaunch.config.profiles import load_profile
from hpclaunch.planning.validate import validate

#: The login environment validation sees: a user, a PATH, nothing of Slurm's.
ENV = {"USER": "alice", "PATH": "/usr/bin:/bin"}
#: What LUMI needs on every run (it has no default partition and charges an account).
LUMI_RUN = {"partition": "small-g", "account": "project_465000000"}
#: The venv's bin folder (hpclaunch, python) for commands run as a child.
VENV_BIN = Path(__file__).resolve().parents[1] / ".venv" / "bin"


def cli_spec(
    values: Mapping[str, Any],
    cluster: str = "lumi",
    step: bool = False,
    lumi_run: Mapping[str, Any] = LUMI_RUN,
) -> JobSpec:
    """The JobSpec of ``python t.py`` in project "p" with ``values`` given on the command
    line; on LUMI on top of ``lumi_run`` (partition and account), elsewhere on nothing."""
    given = {**(lumi_run if cluster == "lumi" else {}), **values}
    sources = {key: "cli" for key in given}
    return validate(
        load_profile(cluster), RunOptions(**given), sources, ("python", "t.py"), ENV, step, "p"
    )


def local_env(root: Path) -> dict[str, str]:
    """This process's environment for an ``hpclaunch`` child on the local backend: no
    SLURM_*/HPCLAUNCH_* inherited from a job the tests may run in, runs indexed under
    ``root/xdg``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPCLAUNCH"))}
    env.update(XDG_DATA_HOME=str(root / "xdg"), HPCLAUNCH_CLUSTER="local")
    return env


def bare_local_env(root: Path, **extra: str) -> dict[str, str]:
    """A minimal environment for an ``hpclaunch`` child on the local backend, plus
    ``extra``: the venv and the system's bin on PATH (no Slurm), HOME and XDG folders
    under ``root``, and no USER or LOGNAME, as under cron or in a CI container."""
    return {
        "PATH": f"{VENV_BIN}:/usr/bin:/bin",
        "HOME": str(root),
        "XDG_DATA_HOME": str(root / "xdg"),
        "XDG_CONFIG_HOME": str(root / "xdg"),
        "HPCLAUNCH_CLUSTER": "local",
        "LANG": "C.UTF-8",
        **extra,
    }


# A local rank that takes its time to exit (the exit-code tests of Ctrl-C and SIGTERM).
KEEPS_ON = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: print('term', flush=True))\n"
    "print('up', flush=True)\n"
    "time.sleep(300)\n"
)  # a rank that takes its time to exit: SIGTERM only makes it say so


def skip_without(module: str) -> None:
    """Skip the test where MODULE is not installed, without importing it: the ranks import
    it, and pytest.importorskip would import it in the pytest worker too (lightning ~8 s
    of CPU, torch ~3 s, each worker that runs such a test)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"could not import {module!r}")
