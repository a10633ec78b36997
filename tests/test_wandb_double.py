"""Tests of the W&B agent test double (tests/doubles/wandb) itself, without Slurm.

The double stands in for `wandb agent`, whose service cannot be reached from here: sweeps
come from the folder $WANDB_DOUBLE_SWEEPS (ENTITY/PROJECT/ID.json), and each run is started
as wandb 0.31's agent starts it (tests/doubles/README.md). These tests run it directly with
a probe program that prints what it was given.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
DOUBLES = REPO / "tests" / "doubles"
DOUBLE = DOUBLES / "wandb"
KEY = "k" * 40
# What the run sees: its argv, its WANDB_* environment, stdin, process group, param file.
PROBE = """\
import json, os, sys
path = os.environ.get("WANDB_SWEEP_PARAM_PATH", "")
print("PROBE " + json.dumps({
    "argv": sys.argv,
    "env": {k: v for k, v in os.environ.items() if k.startswith("WANDB_")},
    "stdin": sys.stdin.read(),
    "own_group": os.getpgid(0) == os.getpid(),
    "param_file": open(path).read() if os.path.isfile(path) else None,
}), flush=True)
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture
def lab(tmp_path: Path) -> dict[str, Path]:
    """A sweeps folder, a working directory with the probe, and a private HOME/TMPDIR."""
    sweeps, work, home = tmp_path / "sweeps", tmp_path / "work", tmp_path / "home"
    for folder in (sweeps, work, home):
        folder.mkdir()
    (work / "probe.py").write_text(PROBE)
    return {"root": tmp_path, "sweeps": sweeps, "work": work, "home": home}


def write_sweep(
    lab: dict[str, Path],
    config: dict[str, Any],
    sweep: str = "ent/proj/abc12345",
    suffix: str = ".json",
) -> Path:
    path = lab["sweeps"] / f"{sweep}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


def env_for(lab: dict[str, Path], **extra: Optional[str]) -> dict[str, str]:
    """The double first on PATH, then this Python's folder (its `python` runs the probe)."""
    env = {
        "PATH": os.pathsep.join(
            [
                str(DOUBLES),
                str(Path(sys.executable).parent),
                os.environ.get("PATH", "/usr/bin:/bin"),
            ]
        ),
        "HOME": str(lab["home"]),
        "TMPDIR": str(lab["root"]),
        "WANDB_DOUBLE_SWEEPS": str(lab["sweeps"]),
        "WANDB_API_KEY": KEY,
        "LANG": "C.UTF-8",
    }
    for name, value in extra.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def wandb(
    lab: dict[str, Path], *args: str, **extra: Optional[str]
) -> subprocess.CompletedProcess[str]:
    """`wandb ARGS` found on PATH (the double), in the working directory."""
    return subprocess.run(
        ["wandb", *args],
        env=env_for(lab, **extra),
        cwd=lab["work"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def probes(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in proc.stdout.splitlines() if line.startswith("PROBE ")]


def records(lab: dict[str, Path], sweep: str = "ent/proj/abc12345") -> list[dict[str, Any]]:
    path = lab["sweeps"] / f"{sweep}.runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


GRID = {
    "program": "probe.py",
    "method": "grid",
    "parameters": {"lr": {"values": [0.1, 0.01]}, "batch": {"values": [16, 32]}},
}


def test_version(lab: dict[str, Path]) -> None:
    done = wandb(lab, "--version")
    assert (done.returncode, done.stdout) == (0, "wandb, version 0.31.0-double\n")


USAGE = "Usage: wandb agent [OPTIONS] SWEEP_ID\nTry 'wandb agent --help' for help.\n\n"
TOP = "Usage: wandb [OPTIONS] [COMMAND] [ARGS]...\nTry 'wandb --help' for help.\n\n"


INVALID = "Error: Invalid value for "
GRAMMAR = [
    (["agent", "--bogus", "x"], USAGE + "Error: No such option '--bogus'.\n"),
    (
        ["agent", "--cou", "1", "x"],
        USAGE + "Error: No such option '--cou'. Did you mean '--count'?\n",
    ),
    (["agent", "-x", "s"], USAGE + "Error: No such option '-x'.\n"),
    (["agent"], USAGE + "Error: Missing argument 'SWEEP_ID'.\n"),
    (["agent", "--count", "1", "--"], USAGE + "Error: Missing argument 'SWEEP_ID'.\n"),
    (
        ["agent", "--count", "x", "s"],
        USAGE + INVALID + "'--count': 'x' is not a valid integer.\n",
    ),
    (
        ["agent", "-t", "1.5", "s"],
        USAGE + INVALID + "'--term-timeout' / '-t': '1.5' is not a valid integer.\n",
    ),
    (
        ["agent", "--max-consecutive-failed-runs", "0", "s"],
        USAGE + INVALID + "'--max-consecutive-failed-runs': 0 is not in the range x>=1.\n",
    ),
    (["agent", "--count", "1", "a", "b"], USAGE + "Error: Got unexpected extra argument (b)\n"),
    (["agent", "a", "b", "c"], USAGE + "Error: Got unexpected extra arguments (b c)\n"),
    (["agent", "--count"], "Error: Option '--count' requires an argument.\n"),
    (
        ["agent", "--forward-signals=true", "s"],
        "Error: Option '--forward-signals' does not take a value.\n",
    ),
    (["bogus"], TOP + "Error: No such command 'bogus'.\n"),
    (["agnt", "s"], TOP + "Error: No such command 'agnt'. Did you mean 'agent'?\n"),
    (["--bogus"], TOP + "Error: No such option '--bogus'.\n"),
]


@pytest.mark.parametrize(("args", "stderr"), GRAMMAR)
def test_grammar_refusals_are_clicks(lab: dict[str, Path], args: list[str], stderr: str) -> None:
    write_sweep(lab, GRID)
    done = wandb(lab, *args)
    assert (done.returncode, done.stderr) == (2, stderr)
    assert not records(lab)


def test_options_anywhere_and_last_wins(lab: dict[str, Path]) -> None:
    write_sweep(lab, GRID)
    done = wandb(
        lab, "agent", "abc12345", "-pproj", "--entity=ent", "--count", "5", "--count=1", "-f"
    )
    assert done.returncode == 0, done.stderr
    assert len(records(lab)) == 1


def test_other_real_commands_are_refused_naming_the_double(lab: dict[str, Path]) -> None:
    done = wandb(lab, "sweep", "sweep.yaml")
    assert done.returncode == 1
    assert "wandb-double:" in done.stderr and "`wandb sweep`" in done.stderr
    assert "tests/doubles/wandb" in done.stderr


def test_unknown_sweep_is_the_real_error(lab: dict[str, Path]) -> None:
    write_sweep(lab, GRID)
    done = wandb(lab, "agent", "--count", "1", "ent/proj/nosuch99")
    lines = done.stderr.splitlines()
    assert done.returncode == 1
    assert lines[0] == "wandb: Starting wandb agent 🕵️"
    assert lines[1] == (
        "wandb: [wandb.login()] Loaded credentials for "
        "https://api.forge.coreweave.com from WANDB_API_KEY."
    )
    assert lines[2].startswith("wandb: ERROR Find detailed error logs at: ")
    assert Path(lines[2].rsplit(" ", 1)[1]).is_file()
    assert lines[3:] == ["Error: Sweep ent/proj/nosuch99 not found"]
    done = wandb(lab, "agent", "--count", "1", "nosuch99")  # entity/project not given
    assert done.stderr.splitlines()[-1] == "Error: Sweep None/None/nosuch99 not found"
    done = wandb(lab, "agent", "a/b/c/d")
    assert done.returncode == 0
    assert done.stderr.splitlines()[-1] == (
        "wandb: ERROR Expected sweep_id in form of sweep, project/sweep, or entity/project/sweep"
    )


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (None, "Error: No API key configured. Use `wandb login` to log in."),
        ("", "Error: No API key configured. Use `wandb login` to log in."),
        ("short", "Error: WANDB_API_KEY invalid: API key must have 40+ characters, has 5."),
        (
            "x y" * 20,
            "Error: WANDB_API_KEY invalid: API key may only contain the letters "
            "A-Z, digits and underscores.",
        ),
    ],
)
def test_the_api_key_is_needed(lab: dict[str, Path], key: Optional[str], message: str) -> None:
    write_sweep(lab, GRID)
    for mode in ("online", "offline"):  # wandb 0.31 logs in even with WANDB_MODE=offline
        done = wandb(
            lab, "agent", "--count", "1", "ent/proj/abc12345", WANDB_API_KEY=key, WANDB_MODE=mode
        )
        assert done.returncode == 1
        assert done.stderr.splitlines()[-1] == message
        assert "wandb: ERROR Find detailed error logs at: " in done.stderr
        assert not probes(done) and not records(lab)


def test_without_the_sweeps_folder_it_says_it_is_the_double(lab: dict[str, Path]) -> None:
    done = wandb(lab, "agent", "--count", "1", "ent/proj/abc12345", WANDB_DOUBLE_SWEEPS=None)
    assert done.returncode == 1
    assert "wandb-double: WANDB_DOUBLE_SWEEPS is not set" in done.stderr


def test_grid_points_in_order_with_args_env_and_param_file(lab: dict[str, Path]) -> None:
    write_sweep(lab, GRID)
    seen = []
    for _ in range(4):
        done = wandb(lab, "agent", "--count", "1", "ent/proj/abc12345")
        assert done.returncode == 0, done.stderr
        (probe,) = probes(done)
        seen.append(probe)
        run_id = probe["env"]["WANDB_RUN_ID"]
        assert len(run_id) == 8 and run_id.isalnum() and run_id == run_id.lower()
        param_path = lab["work"] / "wandb" / "sweep-abc12345" / f"config-{run_id}.yaml"
        assert probe["env"] == {
            "WANDB_API_KEY": KEY,
            "WANDB_DOUBLE_SWEEPS": str(lab["sweeps"]),
            "WANDB_ENTITY": "ent",
            "WANDB_PROJECT": "proj",
            "WANDB_SWEEP_ID": "abc12345",
            "WANDB_DIR": str(lab["work"]),
            "WANDB_RUN_ID": run_id,
            "WANDB_SWEEP_PARAM_PATH": str(param_path),
        }
        assert probe["stdin"] == "" and probe["own_group"]
        # The real agent's log lines (timestamps aside), on stderr.
        logged = [line.split(" - ", 3)[-1] for line in done.stderr.splitlines()[2:]]
        batch, lr = probe["argv"][1].split("=")[1], probe["argv"][2].split("=")[1]
        assert logged == [
            "Running runs: []",
            "Agent received command: run",
            "Agent starting run with config:",
            f"\tbatch: {batch}",
            f"\tlr: {lr}",
            f"About to run command: /usr/bin/env python probe.py --batch={batch} --lr={lr}",
            f"Running runs: ['{run_id}']",
            f"Cleaning up finished run: {run_id}",
        ]
    # itertools.product over the parameters sorted by name, the last varying fastest
    assert [p["argv"][1:] for p in seen] == [
        ["--batch=16", "--lr=0.1"],
        ["--batch=16", "--lr=0.01"],
        ["--batch=32", "--lr=0.1"],
        ["--batch=32", "--lr=0.01"],
    ]
    assert seen[1]["param_file"] == "wandb_version: 1\n\nbatch:\n  value: 16\nlr:\n  value: 0.01\n"
    runs = records(lab)
    assert [r["index"] for r in runs] == [0, 1, 2, 3]
    assert runs[3]["params"] == {"batch": 32, "lr": 0.01}
    assert runs[3]["argv"] == ["/usr/bin/env", "python", "probe.py", "--batch=32", "--lr=0.01"]
    assert all(r["exit_code"] == 0 and r["api_key_set"] and r["host"] for r in runs)
    assert "WANDB_API_KEY" not in runs[0]["wandb_env"]
    # The grid is used up: W&B's exit command, no run, exit 0.
    done = wandb(lab, "agent", "--count", "1", "ent/proj/abc12345")
    assert done.returncode == 0 and not probes(done)
    assert "Received exit command. Killing runs and quitting." in done.stderr
    assert len(records(lab)) == 4


def test_concurrent_agents_get_distinct_points(lab: dict[str, Path]) -> None:
    write_sweep(lab, GRID)
    env = env_for(lab, SLURMD_NODENAME="node7")
    agents = [
        subprocess.Popen(
            ["wandb", "agent", "--count", "1", "ent/proj/abc12345"],
            env=env,
            cwd=lab["work"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [agent.communicate(timeout=60) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0, 0, 0], outputs
    runs = records(lab)
    assert sorted(r["index"] for r in runs) == [0, 1, 2, 3]
    assert sorted((r["params"]["batch"], r["params"]["lr"]) for r in runs) == [
        (16, 0.01),
        (16, 0.1),
        (32, 0.01),
        (32, 0.1),
    ]
    assert len({r["run_id"] for r in runs}) == 4
    assert {r["host"] for r in runs} == {"node7"}


def test_custom_command_macros(lab: dict[str, Path]) -> None:
    write_sweep(
        lab,
        {
            "program": "probe.py",
            "method": "grid",
            "command": [
                "${env}",
                "${interpreter}",
                "${program}",
                "--fixed",
                "${args_no_hyphens}",
                "${args_json}",
                "${args_json_file}",
                "${args_no_boolean_flags}",
                "--x=${args}",
                "${envvar:MY_VAR}",
                "${nosuchmacro}",
                7,
            ],
            "parameters": {
                "opt": {"value": "adam w"},
                "flag": {"values": [True]},
                "off": {"value": False},
                "n": {"value": 3},
            },
        },
    )
    done = wandb(lab, "agent", "--count", "1", "ent/proj/abc12345", MY_VAR="from-env")
    assert done.returncode == 0, done.stderr
    (probe,) = probes(done)
    run_id = probe["env"]["WANDB_RUN_ID"]
    json_file = lab["work"] / "wandb" / "sweep-abc12345" / f"config-{run_id}.json"
    as_json = '{"flag": true, "n": 3, "off": false, "opt": "adam w"}'
    assert probe["argv"] == [
        "probe.py",
        "--fixed",
        "flag=True",
        "n=3",
        "off=False",
        "opt=adam w",  # ${args_no_hyphens}
        as_json,  # ${args_json}
        str(json_file),  # ${args_json_file}
        "--flag",
        "--n=3",
        "--opt=adam w",  # ${args_no_boolean_flags}: False left out
        "--x=${args}",  # a macro inside a longer element stays as written
        "from-env",  # ${envvar:MY_VAR}; an unknown macro vanishes; 7 becomes "7"
        "7",
    ]
    assert json_file.read_text() == as_json
    assert probe["param_file"] == (  # YAML 1.1 quotes the key off, as PyYAML does
        "wandb_version: 1\n\nflag:\n  value: true\nn:\n  value: 3\n'off':\n  value: false\n"
        "opt:\n  value: adam w\n"
    )
    assert '"--opt=adam w"' in done.stderr  # the log quotes elements holding a space


def test_random_method_with_min_max(lab: dict[str, Path]) -> None:
    write_sweep(
        lab,
        {
            "program": "probe.py",
            "method": "random",
            "parameters": {
                "lr": {"min": 0.0001, "max": 0.1},
                "layers": {"min": 2, "max": 5},
                "opt": {"values": ["adam", "sgd"]},
                "wd": {"value": 0.5},
                "scale": {"distribution": "log_uniform_values", "min": 1e-5, "max": 1e-1},
            },
        },
    )
    for _ in range(6):
        done = wandb(lab, "agent", "--count", "1", "ent/proj/abc12345")
        assert done.returncode == 0, done.stderr
    runs = records(lab)
    assert [r["index"] for r in runs] == list(range(6))
    for run in runs:
        params = run["params"]
        assert isinstance(params["lr"], float) and 0.0001 <= params["lr"] <= 0.1
        assert isinstance(params["layers"], int) and 2 <= params["layers"] <= 5
        assert params["opt"] in ("adam", "sgd") and params["wd"] == 0.5
        assert 1e-5 <= params["scale"] <= 1e-1
        assert run["argv"][3:] == [f"--{k}={params[k]}" for k in sorted(params)]
    assert len({r["params"]["lr"] for r in runs}) == 6  # fresh draws per point
    assert runs[0]["params"] != runs[1]["params"]


def test_count_two_runs_two_points(lab: dict[str, Path]) -> None:
    write_sweep(lab, GRID)
    done = wandb(lab, "agent", "--count", "2", "ent/proj/abc12345")
    assert done.returncode == 0, done.stderr
    assert [p["argv"][1:] for p in probes(done)] == [
        ["--batch=16", "--lr=0.1"],
        ["--batch=16", "--lr=0.01"],
    ]
    assert len({p["env"]["WANDB_RUN_ID"] for p in probes(done)}) == 2


def test_a_failed_run_still_exits_zero(lab: dict[str, Path]) -> None:
    write_sweep(lab, GRID)
    done = wandb(lab, "agent", "--count", "1", "ent/proj/abc12345", PROBE_EXIT="3")
    assert done.returncode == 0, done.stderr
    assert records(lab)[0]["exit_code"] == 3


def test_a_program_that_cannot_start(lab: dict[str, Path]) -> None:
    write_sweep(lab, {**GRID, "command": ["no-such-program-xyz", "${args}"]})
    done = wandb(lab, "agent", "--count", "1", "ent/proj/abc12345")
    assert done.returncode == 1
    assert "Exception while processing command" in done.stderr
    assert "wandb-double:" in done.stderr
    (run,) = records(lab)
    assert run["exit_code"] is None and "no-such-program-xyz" in run["error"]


def test_sweep_id_forms(lab: dict[str, Path]) -> None:
    write_sweep(lab, GRID)
    done = wandb(lab, "agent", "--count", "1", "abc12345")  # the only match in the folder
    assert done.returncode == 0, done.stderr
    (probe,) = probes(done)
    assert "WANDB_ENTITY" not in probe["env"] and "WANDB_PROJECT" not in probe["env"]
    done = wandb(lab, "agent", "--count", "1", "-e", "ent", "proj/abc12345")
    (probe,) = probes(done)
    assert (probe["env"]["WANDB_ENTITY"], probe["env"]["WANDB_PROJECT"]) == ("ent", "proj")
    assert probe["env"]["WANDB_SWEEP_ID"] == "abc12345"
    done = wandb(lab, "agent", "--count", "1", "-e", "other", "ent/proj/abc12345")
    assert probes(done)[0]["env"]["WANDB_ENTITY"] == "ent"  # the path wins
    assert len(records(lab)) == 3


def test_yaml_sweep_file_and_wandb_dir(lab: dict[str, Path]) -> None:
    pytest.importorskip("yaml")
    path = lab["sweeps"] / "ent" / "proj" / "yml00001.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("program: probe.py\nmethod: grid\nparameters:\n  a:\n    values: [x, y]\n")
    wandb_dir = lab["root"] / "wdir"
    done = wandb(lab, "agent", "--count", "1", "ent/proj/yml00001", WANDB_DIR=str(wandb_dir))
    assert done.returncode == 0, done.stderr
    (probe,) = probes(done)
    assert probe["argv"][1:] == ["--a=x"]
    assert probe["env"]["WANDB_SWEEP_PARAM_PATH"].startswith(
        str(wandb_dir / "wandb" / "sweep-yml00001")
    )


def _load_double() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("wandb_double", str(DOUBLE))
    spec = importlib.util.spec_from_loader("wandb_double", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "value",
    [
        1,
        -3,
        0.1,
        1e-05,
        3e20,
        True,
        False,
        None,
        "adam",
        "x y",
        "/tmp/a",
        "a: b",
        "1",
        "yes",
        "",
        "it's",
        "n",
        "y",
        [1, 2.5],
        [],
        {},
        {"k": [1, {"z": "q"}]},
    ],
)
def test_param_file_without_pyyaml_is_equivalent(value: Any) -> None:
    """The built-in emitter (used when PyYAML is missing) gives what PyYAML gives for
    numbers, booleans, null, lists, mappings and plain words, and equal values always."""
    yaml = pytest.importorskip("yaml")
    double = _load_double()
    args = {"p": {"value": value}, "n": {"value": 1}}
    real = double.param_file_text(args)  # PyYAML's bytes, as the real agent writes them
    double.yaml = None
    ours = double.param_file_text(args)
    assert ours.startswith("wandb_version: 1\n\n")
    assert yaml.safe_load(ours) == {"wandb_version": 1, **args}
    if not isinstance(value, str) or value in ("adam", "x y", "/tmp/a", "n", "y"):
        assert ours == real
