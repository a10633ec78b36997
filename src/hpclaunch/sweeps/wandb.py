"""W&B sweeps on Slurm: every point runs `wandb agent --count 1 ENTITY/PROJECT/ID` where
its job runs (W&B's own advice for Slurm): on the batch host after the --setup lines,
inside the container when one is given, with the run's --env values. The sweep's command
is `hpclaunch run -- ...`; there it is the shipped stdlib node/wandb_agent.py, which hands
the program line and the parameters to the batch shell's side (`python -m` this module),
which runs the point's own job.sh: every rank (so only the agent pulls a configuration and
all ranks of a multi-node point get the same one), with the point's folder, container,
venv and staged data. The image needs neither hpclaunch nor srun.

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
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from hpclaunch import node
from hpclaunch.basics import shell
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.errors import UserError, show
from hpclaunch.node.wandb_agent import flat_params
from hpclaunch.payload import containers
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script.launchers import encode_argv
from hpclaunch.sweeps.script import POINT_DIR, WANDB_EXIT, WANDB_POINT

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


def check_agent(environ: Mapping[str, str], spec: JobSpec) -> list[str]:
    """Check `wandb` the way the job finds it, where that is possible here: the job's PATH
    is this one (sbatch passes it on), the --venv's bin first. After --setup lines or
    inside a container it cannot be known here: a note, and a point that finds none
    fails saying so (node/wandb_agent.py). Returns the notes."""
    if spec.container is not None or spec.setup:
        where = "inside " + spec.container.image if spec.container else "after the --setup lines"
        return [
            f"hpclaunch: note: `wandb` is looked for where each point runs ({where}); "
            "a point that finds none fails saying so"
        ]
    path = environ.get("PATH", "")
    path = f"{spec.venv}/bin:{path}" if spec.venv else path
    found = shutil.which("wandb", path=path)
    if found is None:
        venv = f" or in {spec.venv}/bin" if spec.venv else ""
        raise UserError(
            "--wandb-sweep",
            f"no `wandb` on PATH{venv}",
            "each point runs `wandb agent` where its job runs",
            "pip install wandb where the nodes see it, or load it with --setup",
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
    return []


def agent_lines(spec: JobSpec, python: str, paths: RunPaths, sweep_id: str) -> list[str]:
    """The array script's subshell that starts a point's agent where its job runs: the
    --setup lines, the run's --env values, then (inside the container, through the
    bootstrap's exec-only mode: the job's environment, --venv) node/wandb_agent.py."""
    inner: list[shell.Word] = [python, *node.PYTHON_FLAGS, str(paths.bootstrap)]
    if spec.container is not None:
        inner.append(f"{node.ENV_FD_FLAG}{containers.ENV_FD}")
    inner += [node.EXEC_FLAG, python, *node.PYTHON_FLAGS, str(paths.shipped(node.WANDB_AGENT))]
    inner += ["agent", shell.Var(POINT_DIR), "wandb", "agent", "--count", "1", sweep_id]
    lines: list[str] = []
    if spec.setup:
        lines += ["set -e", *spec.setup, "set +e"]
    lines += [shell.export(k, v) for k, v in spec.public_env()]
    if spec.venv:
        lines.append(shell.export(node.HPCLAUNCH_VENV, spec.venv))
    argv = inner
    if spec.container is not None:
        names = [k for k, _ in spec.env] + [API_KEY, "WANDB_*"]
        passed = containers.pass_list(spec.container, names)
        lines.append(shell.export(node.HPCLAUNCH_CONTAINER_PASS, passed))
        argv = containers.wrap(spec.container, inner)
    return [*lines, "exec " + shell.command(argv)]


def params_from_file(path: str) -> dict[str, Any]:
    """The agent's WANDB_SWEEP_PARAM_PATH file: `wandb_version: 1` and {name: {value: v}}
    in YAML (PyYAML when importable, else the flat form the agent writes)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return {}
    return params_from_text(text)


def params_from_text(text: str) -> dict[str, Any]:
    """The parameter file's text (as node/wandb_agent.py hands it over) -> {name: value}."""
    if not text:
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
    """`name:` then an indented `value: X` per parameter (X read as JSON, else text), as
    the packed point's agent reads them on the node (one reader for both)."""
    return {name: {"value": value} for name, value in flat_params(text).items()}


def point_env(params: Mapping[str, Any], program: Sequence[str]) -> dict[str, str]:
    """What a W&B point's ranks get beside the agent's own WANDB_* variables."""
    from hpclaunch.sweeps.points import format_value

    usable = {k: v for k, v in params.items() if isinstance(v, (str, int, float, bool))}
    env = {node.HPCLAUNCH_PARAM_NAMES: ",".join(usable)}
    env.update({node.PARAM_PREFIX + k.upper(): format_value(v) for k, v in usable.items()})
    env["HPCLAUNCH_PARAMS"] = json.dumps(usable, separators=(",", ":"))
    env[node.HPCLAUNCH_POINT_PROGRAM] = encode_argv(tuple(program))
    return env


def run_point(
    program: Sequence[str], environ: Mapping[str, str], params: Optional[dict[str, Any]] = None
) -> int:
    """The sweep's command (`hpclaunch run -- PROGRAM`) inside a W&B point: the point's
    job.sh runs PROGRAM on every rank; its exit code is kept for the agent's side."""
    from hpclaunch.records import runrecord

    folder = Path(environ[WANDB_POINT])
    if params is None:
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


def take_over(folder: Path, agent_pid: int, environ: Mapping[str, str]) -> int:
    """The batch shell's side of a point: wait for the agent's hand-off (the sweep's
    command, node/wandb_agent.py), then run the point's job.sh with it; or, when the agent
    ends without one (no wandb where the job runs, a failed --setup line, a refused
    login), say so in one line and fail the point."""
    handoff = folder / node.HANDOFF
    while not handoff.exists():
        if not _alive(agent_pid):
            if handoff.exists():
                break
            print(
                "hpclaunch: the W&B agent ended without handing over the sweep's command "
                "(its output is above; the sweep's command must be `hpclaunch run -- ...`, "
                "see hpclaunch sweep wandb-template); this point did not start",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.2)
    data = json.loads(handoff.read_text(encoding="utf-8"))
    env = {**environ, **{str(k): str(v) for k, v in data.get("env", {}).items()}}
    env[WANDB_POINT] = str(folder)
    program = [str(word) for word in data.get("program", [])]
    try:
        return run_point(program, env, params_from_text(str(data.get("params", ""))))
    except BaseException:
        (folder / WANDB_EXIT).write_text("1\n")  # the agent's run must not wait forever
        raise


def _alive(pid: int) -> bool:
    """Whether the agent's subshell still runs (a zombie, not yet waited for, has ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


if __name__ == "__main__":  # the array script: python -m hpclaunch.sweeps.wandb DIR PID
    from hpclaunch.basics.environ import environment

    sys.exit(take_over(Path(sys.argv[1]), int(sys.argv[2]), environment()))
