"""hpclaunch/node: the files shipped to the nodes import nothing of hpclaunch, keep to
the Python versions they promise, run under `python3 -I -S` (the old interpreters too,
where this machine has them), agree with the host on every constant they share, and
write the run's events."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import pytest

from hpclaunch import node
from hpclaunch.payload import venvs
from pythons import python_of

NODE_DIR = Path(node.__file__).parent
GOLDEN = Path(__file__).parent / "golden"
# The oldest Python each shipped file promises to run on.
PROMISED = {
    node.BOOTSTRAP: (3, 8),
    node.LOADER: (3, 8),
    node.STAGE_GUARD: (3, 6),
    node.VENV_PROBE: (3, 8),
    node.GPU_WATCH: (3, 6),
    node.STACK_PROBE: (3, 6),
    node.RELAY: (3, 8),
    node.DEV_SSHD: (3, 8),
    node.WANDB_AGENT: (3, 6),
    node.PACK_AGENT: (3, 8),
    node.VENV_MOUNT: (3, 6),
    node.STAGE_BCAST: (3, 6),
    node.PREFLIGHT: (3, 6),
}
# What each shipped file shares with the host (hpclaunch.node's names).
SHARED = {
    node.BOOTSTRAP: {
        "EVENTS", "RANK_START", "RANK_END", "RANKS_TSV", "RANK_FILE", "OUT", "ERR", "EXIT",
        "PORT_BASE", "PORT_SPAN", "ENV_FD_FLAG", "EXEC_FLAG", "HPCLAUNCH_RUN_DIR",
        "HPCLAUNCH_PARAM_NAMES", "PARAM_PREFIX", "HPCLAUNCH_POINT_ARGS",
        "HPCLAUNCH_POINT_PROGRAM",
        "HPCLAUNCH_LOG_DIR", "HPCLAUNCH_ARGV", "HPCLAUNCH_FORWARD_SIGNALS",
        "HPCLAUNCH_GPU_VISIBILITY", "HPCLAUNCH_GPU_VARS", "HPCLAUNCH_GPU_UNSET",
        "HPCLAUNCH_MASTER_SUFFIX",
        "HPCLAUNCH_CACHE_DIRS", "HPCLAUNCH_VENV", "HPCLAUNCH_CONTAINER_PASS",
        "HPCLAUNCH_RESULT_FILE", "RESULT_JSON", "HPCLAUNCH_ATTEMPT", "HPCLAUNCH_REQUEUE_SIGNAL",
        "HPCLAUNCH_PROFILER", "HPCLAUNCH_PROFILE_RANKS", "HPCLAUNCH_PROFILE_DIR",
        "HPCLAUNCH_PROFILE", "HPCLAUNCH_PYSPY", "CHILD_FLAG", "HPCLAUNCH_NCCL_COLLECT",
        "NCCL_DIR", "NCCL_FILE", "HPCLAUNCH_LOCAL", "HPCLAUNCH_LOCAL_PARENT",
        "HPCLAUNCH_LOCAL_RECORD", "LOCAL_PREFIX", "LOCAL_UNSET", "HPCLAUNCH_NODE_LABEL",
        "HPCLAUNCH_NODE_LOGS", "NODE_FILE", "EXITS",
    },
    node.STAGE_GUARD: {
        "EVENTS", "STAGE_READY", "STAGE_DONE", "STAGE_MARKS", "READY", "FAILED", "DIRECTORY",
        "ARCHIVE", "SQUASHFS", "FILE", "PACK_PART", "LOCAL_PREFIX", "HPCLAUNCH_LOCAL",
        "HPCLAUNCH_LOCAL_PARENT", "HPCLAUNCH_LOCAL_RECORD", "HPCLAUNCH_ATTEMPT",
        "HPCLAUNCH_STAGE_MARKS", "LINKS_PART", "HPCLAUNCH_STAGE_BCAST",
    },
    node.VENV_PROBE: {"VENV_RECORD", "VENV_CONSTRAINTS", "LIST_ONLY"},
    node.GPU_WATCH: {"INPUT_BOUND"},
    node.WANDB_AGENT: {"HANDOFF", "WANDB_EXIT", "HPCLAUNCH_WANDB_POINT", "HPCLAUNCH_WANDB_DIRECT"},
    node.PACK_AGENT: {
        "EVENTS", "PORT_BASE", "PORT_SPAN", "HPCLAUNCH_LOCAL_PARENT", "HPCLAUNCH_LOCAL_RECORD",
    },
    node.VENV_MOUNT: {"READY", "FAILED"},
    node.STAGE_BCAST: {"DIRECTORY", "ARCHIVE", "SQUASHFS", "FILE"},
    node.PREFLIGHT: {"EVENTS", "NODE_BAD"},
}  # fmt: skip
# hpclaunch.node's names that only the host uses.
HOST_ONLY = {
    "BOOTSTRAP", "STAGE_GUARD", "VENV_PROBE", "RUN_DIR_NAME", "PYTHON_FLAGS", "STAGE_JSON",
    "LOGS", "LOADER", "BOOTSTRAP_MODULE", "GPU_WATCH", "METRICS", "GPU_CSV",
    "PROFILES", "PYSPY", "LOCAL_RECORDS", "STACK_PROBE", "RANK_PLACEHOLDERS", "WANDB_AGENT",
    "PACK_AGENT",
    "VENV_MOUNT", "VENV_MARKS", "STAGE_BCAST", "BROADCAST_MAP",
    "PREFLIGHT",
    "RELAY", "DEV_SSHD",
}  # fmt: skip
BUILTIN_GENERICS = {"list", "dict", "set", "frozenset", "tuple", "type"}


def _pythons(version: tuple[int, int]) -> list[Any]:
    """This interpreter, and the promised oldest one (skipped where this machine lacks it)."""
    old = python_of(f"{version[0]}.{version[1]}")
    label = f"python{version[0]}.{version[1]}"
    mark = pytest.mark.skipif(old is None, reason=f"no {label} here")
    return [
        pytest.param(sys.executable, id="current"),
        pytest.param(old or "", id=label, marks=mark),
    ]


def _load(name: str) -> ModuleType:
    """A shipped file as a module of its own (by path, as nothing else may import it)."""
    spec = importlib.util.spec_from_file_location(f"node_{name[:-3]}_under_test", NODE_DIR / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _constants(path: Path) -> dict[str, Any]:
    """Module-level `NAME = literal` and `A, B = literal, literal` of a file."""
    found: dict[str, Any] = {}
    for stmt in ast.parse(path.read_text()).body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            continue
        try:
            value = ast.literal_eval(stmt.value)
        except ValueError:
            continue
        target = stmt.targets[0]
        if isinstance(target, ast.Name):
            found[target.id] = value
        elif isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
            found.update(zip((e.id for e in target.elts if isinstance(e, ast.Name)), value))
    return found


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / node.EVENTS).read_text().splitlines()]


# ----------------------------------------------------------------------------- (a), (b)
@pytest.mark.parametrize("path", sorted(NODE_DIR.glob("*.py")), ids=lambda p: p.name)
def test_imports_nothing_of_hpclaunch(path: Path) -> None:
    for item in ast.walk(ast.parse(path.read_text())):
        if isinstance(item, ast.ImportFrom):
            assert item.level == 0, f"{path.name}:{item.lineno}: a relative import"
            names = [item.module or ""]
        elif isinstance(item, ast.Import):
            names = [alias.name for alias in item.names]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            assert top != "hpclaunch", f"{path.name}:{item.lineno}: imports {name}"
            if path.name == node.LOADER and name == node.BOOTSTRAP_MODULE:
                continue  # the bootstrap itself, shipped beside the loader
            if path.name in PROMISED and hasattr(sys, "stdlib_module_names"):
                assert top in sys.stdlib_module_names, f"{path.name}: {name} is not stdlib"


@pytest.mark.parametrize("name", sorted(PROMISED))
def test_parses_as_its_oldest_python(name: str) -> None:
    version = PROMISED[name]
    tree = ast.parse((NODE_DIR / name).read_text(), feature_version=version)
    lazy = any(
        isinstance(i, ast.ImportFrom)
        and i.module == "__future__"
        and any(a.name == "annotations" for a in i.names)
        for i in ast.walk(tree)
    )
    assert not (lazy and version < (3, 7)), f"{name}: `from __future__ import annotations`"
    # list[int] & co. need 3.9 where they are evaluated: everywhere but in annotations
    # that the __future__ import leaves as strings.
    skip: set[int] = set()
    for item in ast.walk(tree) if lazy else ():
        notes: list[Optional[ast.expr]] = []
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            notes.append(item.returns)
        elif isinstance(item, (ast.arg, ast.AnnAssign)):
            notes.append(item.annotation)
        skip.update(id(sub) for note in notes if note is not None for sub in ast.walk(note))
    if version < (3, 9):
        for item in ast.walk(tree):
            if isinstance(item, ast.Subscript) and id(item) not in skip:
                value = item.value
                bad = isinstance(value, ast.Name) and value.id in BUILTIN_GENERICS
                assert not bad, f"{name}:{item.lineno}: a builtin generic needs Python 3.9"


# ----------------------------------------------------------------------------- (c), (e)
@pytest.mark.parametrize("python", _pythons(PROMISED[node.BOOTSTRAP]))
def test_bootstrap_runs_a_rank_and_writes_its_events(python: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / node.LOGS).mkdir(parents=True)
    for shipped in (node.LOADER, node.BOOTSTRAP):  # as launching.py ships them
        shutil.copyfile(node.path(shipped), run_dir / node.RUN_DIR_NAME[shipped])
    boot = run_dir / node.RUN_DIR_NAME[node.LOADER]
    assert boot.name == "bootstrap.py"  # what the batch scripts (and golden files) name
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        node.HPCLAUNCH_RUN_DIR: str(run_dir),
        node.HPCLAUNCH_LOG_DIR: str(run_dir / node.LOGS),
        "SLURMD_NODENAME": "nodeA",
    }
    before = time.time()
    proc = subprocess.Popen(
        [python, *node.PYTHON_FLAGS, str(boot), sys.executable, "-c", "print(1)"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (0, b"", b"")
    assert (run_dir / node.LOGS / (node.RANK_FILE % (0, node.OUT))).read_text() == "1\n"
    exit_record = json.loads((run_dir / node.LOGS / (node.RANK_FILE % (0, node.EXIT))).read_text())
    assert exit_record["returncode"] == 0
    start, end = _events(run_dir)
    assert start == {
        "event": node.RANK_START,
        "rank": 0,
        "node": "nodeA",
        "pid": proc.pid,
        "time": start["time"],
    }
    assert end == {
        "event": node.RANK_END,
        "rank": 0,
        "node": "nodeA",
        "returncode": 0,
        "time": end["time"],
    }
    assert before <= start["time"] <= end["time"] <= time.time()
    # The bootstrap ran from bytecode cached beside it, for the next ranks to load.
    assert list((run_dir / "__pycache__").glob(node.BOOTSTRAP_MODULE + ".*.pyc"))


def test_bootstrap_events_record_failures_and_never_stop_a_rank(tmp_path: Path) -> None:
    boot = str(node.path(node.BOOTSTRAP))
    run = [sys.executable, *node.PYTHON_FLAGS, boot]
    env = {"PATH": os.environ.get("PATH", ""), node.HPCLAUNCH_RUN_DIR: str(tmp_path)}
    env["SLURM_PROCID"], env["SLURM_NTASKS"] = "3", "4"
    done = subprocess.run([*run, sys.executable, "-c", "exit(7)"], env=env, capture_output=True)
    assert done.returncode == 7
    done = subprocess.run([*run, "no-such-program-xyz"], env=env, capture_output=True)
    assert done.returncode == 127
    ends = [(e["rank"], e["returncode"]) for e in _events(tmp_path) if e["event"] == "rank_end"]
    assert ends == [(3, 7), (3, 127)]
    # A run folder that cannot be written to: the rank runs as if there were no events.
    env[node.HPCLAUNCH_RUN_DIR] = str(tmp_path / "missing")
    done = subprocess.run([*run, sys.executable, "-c", "pass"], env=env, capture_output=True)
    assert (done.returncode, done.stderr) == (0, b"")


@pytest.mark.parametrize("python", _pythons(PROMISED[node.STAGE_GUARD]))
def test_stage_guard_cleans_an_empty_folder(python: str, tmp_path: Path) -> None:
    guard = tmp_path / node.RUN_DIR_NAME[node.STAGE_GUARD]
    shutil.copyfile(node.path(node.STAGE_GUARD), guard)
    (tmp_path / "empty").mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "USER": "nobody-here"}
    for extra in ([], ["--dry-run"]):
        argv = [python, *node.PYTHON_FLAGS, str(guard), "clean", str(tmp_path / "empty"), *extra]
        done = subprocess.run(argv, env=env, capture_output=True, timeout=60)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


def _guard(python: str, tmp_path: Path, archive: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The guard as the batch script starts it, for one node staging one file."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    guard = run_dir / node.RUN_DIR_NAME[node.STAGE_GUARD]
    shutil.copyfile(node.path(node.STAGE_GUARD), guard)
    item = {"name": "F", "kind": node.FILE, "archive": str(archive), "file": "f", "bound": False}
    spec = {"run_dir": str(run_dir), "nodes": 1, "items": [item]}
    spec["stage_out"] = [["out", str(tmp_path / "results")]]
    (run_dir / node.STAGE_JSON).write_text(json.dumps(spec))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "USER": "u",
        "SLURMD_NODENAME": "nodeA",
        "SLURM_JOB_ID": "7",
        node.HPCLAUNCH_LOCAL_PARENT: str(tmp_path),
        node.HPCLAUNCH_LOCAL_RECORD: str(run_dir / node.LOCAL_RECORDS),
    }
    argv = [python, *node.PYTHON_FLAGS, str(guard), "run", str(run_dir / node.STAGE_JSON)]
    return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE), run_dir


@pytest.mark.parametrize("python", _pythons(PROMISED[node.STAGE_GUARD]))
def test_stage_guard_writes_its_events(python: str, tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_text("data")
    proc, run_dir = _guard(python, tmp_path, tmp_path / "data.bin")
    ready = run_dir / node.STAGE_MARKS / (node.READY + "nodeA")
    deadline = time.monotonic() + 60
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists(), proc.communicate()[1]
    record = run_dir / node.LOCAL_RECORDS / "nodeA.7"
    local = Path(record.read_text())  # fresh, private, a name nobody can guess
    assert local.parent == tmp_path and local.name.startswith(node.LOCAL_PREFIX + "7.")
    assert local.stat().st_mode & 0o777 == 0o700
    assert (local / "data" / "F" / "f").read_text() == "data"
    (local / "out").mkdir()
    (local / "out" / "r.txt").write_text("result")
    proc.send_signal(signal.SIGUSR1)  # the batch script's "the ranks are done"
    assert proc.wait(timeout=60) == 0
    assert (tmp_path / "results" / "r.txt").read_text() == "result"
    assert not local.exists() and not record.exists()
    events = [{k: v for k, v in e.items() if k != "time"} for e in _events(run_dir)]
    assert events == [
        {"event": node.STAGE_READY, "node": "nodeA"},
        {"event": node.STAGE_DONE, "node": "nodeA", "ok": True},
    ]


def test_stage_guard_reports_a_failed_staging_as_done_not_ok(tmp_path: Path) -> None:
    proc, run_dir = _guard(sys.executable, tmp_path, tmp_path / "missing.bin")
    assert proc.wait(timeout=60) == 1
    assert (run_dir / node.STAGE_MARKS / (node.FAILED + "nodeA")).exists()
    [done] = _events(run_dir)
    assert (done["event"], done["node"], done["ok"]) == (node.STAGE_DONE, "nodeA", False)


@pytest.mark.parametrize("python", _pythons(PROMISED[node.VENV_PROBE]))
def test_venv_probe_lists_the_packages_as_the_host_asks(python: str) -> None:
    argv = venvs._command(None, python, ["-", "-", json.dumps({node.LIST_ONLY: True})])
    assert argv[:3] == [python, "-I", "-c"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    version = [python, "-c", "import platform; print(platform.python_version())"]
    assert answer["python"] == subprocess.check_output(version, text=True).strip()
    assert isinstance(answer["packages"], dict)


# ----------------------------------------------------------------------------- (d)
@pytest.mark.parametrize("name", sorted(SHARED))
def test_shared_constants_equal_the_hosts(name: str) -> None:
    found = _constants(NODE_DIR / name)
    missing = SHARED[name] - found.keys()
    assert not missing, f"{name} lacks {sorted(missing)}"
    for key, value in found.items():
        if hasattr(node, key):
            assert value == getattr(node, key), f"{name}: {key} = {value!r}"


def test_every_host_constant_is_shared_or_host_only() -> None:
    public = {n for n in vars(node) if n.isupper() and not n.startswith("_")}
    shared = set().union(*SHARED.values())
    assert public == shared | HOST_ONLY
    assert all(getattr(node, n) == n for n in public if n.startswith("HPCLAUNCH_"))


@pytest.mark.parametrize("job_id", [0, 1, 11_999, 12_000, 12_345, 987_654_321, 2**32 - 1])
def test_master_port_is_one_formula_everywhere(job_id: int) -> None:
    expected = node.PORT_BASE + job_id % node.PORT_SPAN
    env = {"SLURM_JOB_ID": str(job_id)}
    _load(node.BOOTSTRAP).set_rank_env(env)
    assert env["MASTER_PORT"] == str(expected)
    # The batch script's own line (the golden scripts are render.py's output).
    for script in sorted(GOLDEN.glob("*.sh")):
        [line] = [s for s in script.read_text().splitlines() if re.match(r"MASTER_PORT=\$\(\(", s)]
        bash = f"SLURM_JOB_ID={job_id}; {line}; echo $MASTER_PORT"
        done = subprocess.run(["bash", "-c", bash], capture_output=True, text=True, check=True)
        assert done.stdout.strip() == str(expected), script.name


def test_one_node_name_in_both_files() -> None:
    boot, guard = _load(node.BOOTSTRAP), _load(node.STAGE_GUARD)
    for env in ({}, {"SLURMD_NODENAME": "nid005000"}):
        assert boot.node_name(env) == guard.node_name(env)
    assert "." not in guard.node_name({})
