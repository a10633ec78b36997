"""Runs where a W&B sweep point's job runs, for `hpclaunch sweep --wandb-sweep`: on the
batch host after the --setup lines, inside the container when one is given (started
there by the bootstrap's exec-only mode, which hands over the job's environment and
activates --venv). Standard library only, Python >= 3.6, never an import of hpclaunch
(the rules: hpclaunch/node/__init__.py). Two roles:

    python3 -I -S wandb_agent.py agent POINT_DIR WANDB [ARGS...]
        runs `wandb agent --count 1 ID` with a private folder first on its PATH that
        holds an `hpclaunch` for the sweep's command (`hpclaunch run -- PROGRAM ...`), so
        the image needs neither hpclaunch nor srun. No `wandb` there: one line, exit 127.
    hpclaunch run [OPTIONS] -- PROGRAM ...      (that `hpclaunch`, run by the agent)
        hands PROGRAM, the agent's WANDB_* variables (not the API key) and its parameter
        file's text to the batch shell in POINT_DIR/wandb-run.json, waits for
        POINT_DIR/wandb-exit (the ranks' exit code, written there once the point's job.sh
        ended) and exits with it, so that W&B sees the run last as long as the ranks.
        A packed point (HPCLAUNCH_WANDB_DIRECT=1, sweep --pack) runs PROGRAM itself, in
        its slot, after writing the same hand-off file (the point's record of the run).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

# Shared with the host side (hpclaunch/node/__init__.py has the same values; a test
# compares them).
HANDOFF = "wandb-run.json"
WANDB_EXIT = "wandb-exit"
HPCLAUNCH_WANDB_POINT = "HPCLAUNCH_WANDB_POINT"
HPCLAUNCH_WANDB_DIRECT = "HPCLAUNCH_WANDB_DIRECT"
PARAMS_JSON = "params.json"  # a packed point's parameters (records/sweeprecord.py's name)
API_KEY = "WANDB_API_KEY"
# The `hpclaunch` the agent finds: static text, the values come from the environment.
SHIM = '#!/bin/sh\nexec "$HPCLAUNCH_WANDB_PYTHON" -I -S "$HPCLAUNCH_WANDB_SCRIPT" handoff "$@"\n'


def say(line: str) -> None:
    sys.stderr.write(f"hpclaunch: {line}\n")
    sys.stderr.flush()


def agent(point_dir: str, argv: List[str]) -> int:
    env = dict(os.environ)
    found = shutil.which(argv[0], path=env.get("PATH", ""))
    if found is None:
        path = env.get("PATH", "")
        say(
            f"no `{argv[0]}` where this point's job runs (after the --setup lines, inside "
            f"the container when one is given; PATH={path}): install wandb there (in the "
            "image, the --venv, or what a --setup line loads)"
        )
        return 127
    shim_dir = tempfile.mkdtemp(prefix="hpclaunch-wandb-")  # private, unpredictable
    try:
        shim = os.path.join(shim_dir, "hpclaunch")
        with open(shim, "w") as handle:
            handle.write(SHIM)
        os.chmod(shim, 0o700)
        env["PATH"] = shim_dir + os.pathsep + env.get("PATH", "")
        env["HPCLAUNCH_WANDB_PYTHON"] = sys.executable
        env["HPCLAUNCH_WANDB_SCRIPT"] = os.path.abspath(__file__)
        env[HPCLAUNCH_WANDB_POINT] = point_dir
        code = subprocess.call([found, *argv[1:]], env=env)
    finally:
        shutil.rmtree(shim_dir, ignore_errors=True)
    if env.get(HPCLAUNCH_WANDB_DIRECT) != "1":
        return code
    try:  # a packed point ends as its run did (W&B's agent exits 0 after any run)
        with open(os.path.join(point_dir, WANDB_EXIT)) as handle:
            return int(handle.read().strip() or "1")
    except (OSError, ValueError):
        return code


def program_of(args: List[str]) -> "Optional[List[str]]":
    """`run [OPTIONS] -- PROGRAM...` -> PROGRAM (the options are the sweep's, not ours)."""
    if not args or args[0] != "run":
        return None
    if "--" in args:
        return args[args.index("--") + 1 :]
    return args[1:]


def handoff(args: List[str]) -> int:
    point_dir = os.environ.get(HPCLAUNCH_WANDB_POINT, "")
    program = program_of(args)
    if not point_dir or not program:
        got = " ".join(["hpclaunch", *args])
        say(
            "inside a W&B point only `hpclaunch run -- PROGRAM ...` runs (the sweep's "
            f"command); got {got}"
        )
        return 2
    params = ""
    path = os.environ.get("WANDB_SWEEP_PARAM_PATH", "")
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                params = handle.read()
        except OSError:
            params = ""
    wandb_env = {k: v for k, v in os.environ.items() if k.startswith("WANDB_") and k != API_KEY}
    data = {"program": program, "env": wandb_env, "params": params}
    target = os.path.join(point_dir, HANDOFF)
    with open(target + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(target + ".tmp", target)  # the batch shell's side sees it whole
    if os.environ.get(HPCLAUNCH_WANDB_DIRECT) == "1":  # a packed point: its slot runs it
        with open(os.path.join(point_dir, PARAMS_JSON), "w", encoding="utf-8") as handle:
            json.dump(flat_params(params), handle)  # the point's parameters (sweep status)
        try:
            code = subprocess.call(program)
        except OSError as exc:
            say("cannot run %s: %s" % (program[0], exc))
            code = 127
        with open(os.path.join(point_dir, WANDB_EXIT), "w") as handle:
            handle.write("%d\n" % code)  # the agent exits 0 whatever its run did
        return code
    done = os.path.join(point_dir, WANDB_EXIT)
    while not os.path.exists(done):
        time.sleep(0.2)
    try:
        with open(done) as handle:
            return int(handle.read().strip() or "1")
    except (OSError, ValueError):
        return 1


def flat_params(text: str) -> Dict[str, Any]:
    """The parameter file's `name:` / indented `value: X` lines -> {name: X} (X read as
    JSON, else as text): what sweeps/wandb.py reads without PyYAML."""
    found = {}  # type: Dict[str, Any]
    name = ""
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            name = line.rstrip()[:-1].strip()
        elif name and line.strip().startswith("value:"):
            raw = line.strip()[len("value:") :].strip()
            try:
                found[name] = json.loads(raw)
            except ValueError:
                found[name] = raw.strip("'\"")
    return found


def main(argv: List[str]) -> int:
    if len(argv) > 3 and argv[1] == "agent":
        return agent(argv[2], argv[3:])
    if len(argv) > 1 and argv[1] == "handoff":
        return handoff(argv[2:])
    say("usage: wandb_agent.py agent POINT_DIR WANDB [ARGS...]")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
