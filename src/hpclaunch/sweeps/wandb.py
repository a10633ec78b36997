"""W&B sweeps on Slurm: every point runs `wandb agent --count 1 ENTITY/PROJECT/ID` on its
batch host (W&B's own advice for Slurm), and the sweep's command is `hpclaunch run -- ...`,
which inside the point becomes the point's own run: its job.sh starts every rank (so only
the agent pulls a configuration and all ranks of a multi-node point get the same one),
with the point's folder, container, venv and staged data.

    hpclaunch sweep --wandb-sweep ENTITY/PROJECT/ID --count N [run options]

The API key reaches the agent and the ranks as a secret (environment only): from
WANDB_API_KEY, else from the file the profile names (`wandb_credentials`, mode 600).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from hpclaunch import node
from hpclaunch.errors import UserError, show
from hpclaunch.script.launchers import encode_argv
from hpclaunch.sweeps.script import WANDB_EXIT, WANDB_POINT

API_KEY = "WANDB_API_KEY"
_SWEEP_ID = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+){0,2}$")  # [[ENTITY/]PROJECT/]ID

TEMPLATE = """\
# A W&B sweep for hpclaunch on Slurm. Create it with `wandb sweep sweep.yaml`, then run
#   hpclaunch sweep --wandb-sweep ENTITY/PROJECT/SWEEP_ID --count N [run options]
# Each of the N points (one Slurm array task) runs `wandb agent --count 1` on its batch
# host; the command below makes that one run the point's own hpclaunch run, so every
# rank of a multi-node point gets the same parameters (only the agent asks W&B).
program: {program}
method: random            # grid | random | bayes
metric:
  name: val_loss          # what your program logs with wandb.log
  goal: minimize
parameters:
  lr:
    distribution: log_uniform_values
    min: 0.00001
    max: 0.01
command:                  # keep `hpclaunch run --` first: it starts the point's ranks
  - hpclaunch
  - run
  - --
  - ${{interpreter}}
  - ${{program}}
  - ${{args}}
# run_cap: 50             # total runs of the sweep; hpclaunch --count is per submission
# On nodes without internet: WANDB_MODE=offline (hpclaunch run --env WANDB_MODE=offline)
# and `wandb sync` the offline runs from a login node afterwards. Resuming a run inside
# a sweep is not supported by W&B: checkpoint and requeue instead (hpclaunch --requeue).
"""


def template(program: Sequence[str]) -> str:
    """W&B's `program` is the script; its interpreter comes from `${interpreter}`."""
    words = list(program)
    if words and Path(words[0]).name.startswith("python") and len(words) > 1:
        words = words[1:]
    return TEMPLATE.format(program=json.dumps(words[0] if words else "train.py"))


def check_sweep_id(value: str) -> str:
    if not _SWEEP_ID.match(value):
        raise UserError(
            "--wandb-sweep",
            f"{show(value)} is not a W&B sweep id",
            "[[ENTITY/]PROJECT/]SWEEP_ID",
            "Copy it from `wandb sweep`",
        )
    return value


def chosen_sweep(cli: Optional[str], project_file: Optional[Path]) -> tuple[Optional[str], str]:
    """The sweep id (the command line's wins over hpclaunch.toml's [sweep] wandb_sweep)
    and a warning when the two differ (seed 003's TODO asks for a visible rule)."""
    from hpclaunch.config.tomlfiles import read_toml

    written = None
    if project_file is not None:
        written = read_toml(project_file, "hpclaunch.toml").get("sweep", {}).get("wandb_sweep")
    if cli and written and str(written) != cli:
        return cli, (
            f"hpclaunch: warning: the command line's W&B sweep {cli} is used, not "
            f"{written} from {project_file} (the command line wins over the project file)"
        )
    return cli or (str(written) if written else None), ""


def api_key(environ: Mapping[str, str], credentials: str) -> Optional[str]:
    """WANDB_API_KEY from the environment, else the profile's credentials file (which
    must be private to its owner: mode 600)."""
    if environ.get(API_KEY):
        return environ[API_KEY]
    if not credentials:
        return None
    path = Path(os.path.expandvars(credentials)).expanduser()
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UserError(
            "wandb_credentials",
            f"cannot read {path}: {exc.strerror}",
            "",
            "Put your API key in it, or set WANDB_API_KEY",
        ) from None
    if stat.S_IMODE(mode) & 0o077:
        raise UserError(
            "wandb_credentials",
            f"{path} is readable by others (mode {stat.S_IMODE(mode):o})",
            "it holds your API key: mode 600",
            f"chmod 600 {path}",
        )
    return text.splitlines()[0].strip() if text else None


def check_agent(environ: Mapping[str, str]) -> list[str]:
    """`wandb` must run on the batch host (outside any container), from storage the
    nodes share; returns the command that starts an agent."""
    found = shutil.which("wandb", path=environ.get("PATH"))
    if found is None:
        raise UserError(
            "--wandb-sweep",
            "no `wandb` on PATH",
            "each point runs `wandb agent` on its batch host",
            "pip install wandb where the nodes see it",
        )
    if found.startswith(("/tmp/", "/dev/shm/")):
        raise UserError(
            "--wandb-sweep", f"{found} is node-local", "", "Install wandb on shared storage"
        )
    done = subprocess.run(
        [found, "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=dict(environ),
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(
            "--wandb-sweep",
            f"{found} --version failed ({last})",
            "",
            "Repair the wandb installation",
        )
    return [found]


def params_from_file(path: str) -> dict[str, Any]:
    """The agent's WANDB_SWEEP_PARAM_PATH file: `wandb_version: 1` and {name: {value: v}}
    in YAML (PyYAML when importable, else the flat form the agent writes)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return {}
    try:
        import yaml  # type: ignore[import-untyped]

        data = yaml.safe_load(text)
    except ImportError:
        data = _flat_yaml(text)
    except Exception:  # a damaged file: the program still gets its --name=value arguments
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v["value"] for k, v in data.items() if isinstance(v, dict) and "value" in v}


def _flat_yaml(text: str) -> dict[str, Any]:
    """`name:` then an indented `value: X` per parameter (X read as JSON, else text)."""
    found: dict[str, Any] = {}
    name = None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            name = line.rstrip()[:-1].strip()
        elif name and line.strip().startswith("value:"):
            raw = line.strip()[len("value:") :].strip()
            try:
                found[name] = {"value": json.loads(raw)}
            except ValueError:
                found[name] = {"value": raw.strip("'\"")}
    return found


def point_env(params: Mapping[str, Any], program: Sequence[str]) -> dict[str, str]:
    """What a W&B point's ranks get beside the agent's own WANDB_* variables."""
    from hpclaunch.sweeps.points import format_value

    usable = {k: v for k, v in params.items() if isinstance(v, (str, int, float, bool))}
    env = {node.HPCLAUNCH_PARAM_NAMES: ",".join(usable)}
    env.update({node.PARAM_PREFIX + k.upper(): format_value(v) for k, v in usable.items()})
    env["HPCLAUNCH_PARAMS"] = json.dumps(usable, separators=(",", ":"))
    env[node.HPCLAUNCH_POINT_PROGRAM] = encode_argv(tuple(program))
    return env


def run_point(program: Sequence[str], environ: Mapping[str, str]) -> int:
    """`hpclaunch run -- PROGRAM` as the agent's command inside a W&B point: the point's
    job.sh runs PROGRAM on every rank; its exit code is kept for the array script."""
    from hpclaunch.records import runrecord

    folder = Path(environ[WANDB_POINT])
    params = params_from_file(environ.get("WANDB_SWEEP_PARAM_PATH", ""))
    env = {**environ, **point_env(params, program)}
    runrecord.write_json(folder / "params.json", dict(params))
    runrecord.update(
        folder, params=params, wandb_run_id=environ.get("WANDB_RUN_ID"), command=list(program)
    )
    print(
        f"hpclaunch: W&B run {environ.get('WANDB_RUN_ID', '?')}: point {folder.name} "
        f"runs {' '.join(program)}",
        file=sys.stderr,
    )
    done = subprocess.run(["bash", str(folder / "job.sh")], env=env, check=False)
    (folder / WANDB_EXIT).write_text(f"{done.returncode}\n")
    return done.returncode
