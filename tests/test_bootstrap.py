"""Tests of the per-task bootstrap (src/hpclaunch/node/bootstrap.py).

The bootstrap runs as a real subprocess (`python3 -I -S bootstrap.py PROGRAM ...`) with
synthetic Slurm / torchrun environments, exactly as a task would run it; its pure helpers
(node lists, task layouts, placeholders) are also checked directly, table-driven.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpclaunch import node
from pythons import python_of

BOOTSTRAP = Path(__file__).resolve().parents[1] / "src" / "hpclaunch" / "node" / "bootstrap.py"
PY = sys.executable
# The interpreter that runs the bootstrap (e.g. BOOTSTRAP_PYTHON=python3.8 for the oldest).
BOOT_PY = os.environ.get("BOOTSTRAP_PYTHON") or PY

# A program that records what it was given: argv as hex of the raw bytes, and its env.
PROBE = """
import json, os, sys
with open(os.environ["PROBE_OUT"], "w") as f:
    json.dump({"argv": [os.fsencode(a).hex() for a in sys.argv[1:]], "env": dict(os.environ)}, f)
"""

# A program that waits (up to 30 s) for SIGUSR1 and records the signals it got (it lingers
# 0.3 s after the first one, so that a duplicate delivery would show).
WAITER = """
import json, os, signal, sys, time
out = sys.argv[1]
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
with open(out + ".pid.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(out + ".pid.tmp", out + ".pid")
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.3)
with open(out, "w") as f:
    json.dump(got, f)
"""


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hpclaunch_bootstrap_under_test", BOOTSTRAP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bs = _load()


def base_env(**extra: str) -> dict[str, str]:
    # Minimal on purpose: nothing from a surrounding Slurm job may leak into the test.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    env.update(extra)
    return env


def boot_cmd(*args: str | bytes, python: str = BOOT_PY) -> list[str | bytes]:
    return [python, "-I", "-S", str(BOOTSTRAP), *args]


def run_boot(
    *args: str | bytes, env: dict[str, str], python: str = BOOT_PY
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(boot_cmd(*args, python=python), env=env, capture_output=True, timeout=60)


@pytest.fixture
def probe(tmp_path: Path) -> Any:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = tmp_path / "probe.json"

    def run(*args: str | bytes, **env: str) -> tuple[dict[str, Any], list[bytes]]:
        proc = run_boot(PY, str(script), *args, env=base_env(PROBE_OUT=str(out), **env))
        assert proc.returncode == 0, proc.stderr
        data = json.loads(out.read_text())
        return data["env"], [bytes.fromhex(a) for a in data["argv"]]

    return run


@pytest.fixture
def waiter(tmp_path: Path) -> Path:
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    return script


def wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def exit_record(log_dir: Path, rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((log_dir / f"rank-{rank}.exit").read_text())
    return data


RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")


# --- pure helpers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("nid[005000-005003,005010]", "nid005000"),
        ("nid[005252]", "nid005252"),
        ("nid[005010,005000-005003]", "nid005010"),
        ("node1,node2", "node1"),
        ("node1", "node1"),
        ("a-[01-02]", "a-01"),
        ("gpu[3]x", "gpu3x"),
        ("gpu[3-4]x,cpu1", "gpu3x"),
        ("rack1-[2-3]-n[1-2]", "rack1-2-n1"),
        ("n[1-2],m[3-4]", "n1"),
        ("nid[000007-000009]", "nid000007"),
        ("", ""),
        ("broken[1-2", "broken[1-2"),
    ],
)
def test_first_host(nodelist: str, first: str) -> None:
    assert bs.first_host(nodelist) == first


@pytest.mark.parametrize(
    ("spec", "node", "tasks"),
    [
        ("2(x3),1", 0, 2),
        ("2(x3),1", 2, 2),
        ("2(x3),1", 3, 1),
        ("8", 0, 8),
        ("4,2", 1, 2),
        ("1,3(x2)", 2, 3),
        ("2(x3),1", 4, None),
        ("garbage", 0, None),
    ],
)
def test_tasks_on_node(spec: str, node: int, tasks: int | None) -> None:
    assert bs.tasks_on_node(spec, node) == tasks


VALUES = {
    "rank": "3",
    "local_rank": "1",
    "world_size": "8",
    "local_world_size": "4",
    "node_rank": "0",
    "master_addr": "nid005000",
    "master_port": "21234",
}


@pytest.mark.parametrize(
    ("arg", "expanded"),
    [
        ("{rank}", "3"),
        ("--rank={rank}", "--rank=3"),
        ("out-{rank}-of-{world_size}.log", "out-3-of-8.log"),
        ("{local_rank}{local_world_size}{node_rank}", "140"),
        ("{master_addr}:{master_port}", "nid005000:21234"),
        ("{{rank}}", "{rank}"),
        ("a{{rank}}b{rank}", "a{rank}b3"),
        ('{"a": 1}', '{"a": 1}'),
        ('{"rank": "{rank}"}', '{"rank": "3"}'),
        ("{x}", "{x}"),
        ("{{x}}", "{{x}}"),
        ("{", "{"),
        ("}", "}"),
        ("{rank", "{rank"),
        ("rank}", "rank}"),
        ("{RANK}", "{RANK}"),
        ("{ rank }", "{ rank }"),
        ("{{rank}", "{3"),
        ("{{{rank}}}", "{{rank}}"),
        ("", ""),
        ("\udcff{rank}\udcfe", "\udcff3\udcfe"),
    ],
)
def test_expand(arg: str, expanded: str) -> None:
    assert bs.expand(arg, VALUES) == expanded


@given(st.text().filter(lambda s: "{" not in s))
def test_expand_leaves_brace_free_text_alone(text: str) -> None:
    assert bs.expand(text, VALUES) is text


@given(st.text(alphabet=st.characters(blacklist_characters="{}")), st.sampled_from(sorted(VALUES)))
def test_expand_escape_gives_the_literal_placeholder(text: str, name: str) -> None:
    arg = text + "{{" + name + "}}" + text
    assert bs.expand(arg, VALUES) == text + "{" + name + "}" + text


# --- contexts -------------------------------------------------------------------------


def test_plain_context(probe: Any) -> None:
    env, _ = probe()
    assert [env[v] for v in RANK_VARS] == ["0", "1", "0", "1", "0"]
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert env["MASTER_PORT"] == "29500"
    assert env["PYTHONNOUSERSITE"] == "1"


def test_srun_context(probe: Any) -> None:
    slurm = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_TASKS_PER_NODE": "8(x2)",  # the job's layout; the step's one wins
        "SLURM_JOB_ID": "1234567",
        "SLURM_JOB_NODELIST": "nid[005000-005003,005010]",
        "SLURM_CPU_BIND": "quiet,mask_cpu:0x1",
    }
    env, _ = probe(**slurm)
    assert dict(zip(RANK_VARS, [env[v] for v in RANK_VARS])) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "1",
    }
    assert env["MASTER_ADDR"] == "nid005000"
    assert env["MASTER_PORT"] == str(20000 + 1234567 % 12000)
    for name, value in slurm.items():  # Slurm's own view stays intact
        assert env[name] == value


def test_srun_context_uneven_layout_and_fallbacks(probe: Any) -> None:
    env, _ = probe(
        SLURM_PROCID="6",
        SLURM_NTASKS="7",
        SLURM_NODEID="3",
        SLURM_LOCALID="0",
        SLURM_TASKS_PER_NODE="2(x3),1",
    )
    assert env["LOCAL_WORLD_SIZE"] == "1"
    assert env["NODE_RANK"] == "3"
    env, _ = probe(SLURM_PROCID="0", SLURM_NTASKS="8", SLURM_JOB_NUM_NODES="2")
    assert env["LOCAL_WORLD_SIZE"] == "4"  # no layout given: an even spread


def test_master_from_step_nodelist_and_existing_values_kept(probe: Any) -> None:
    env, _ = probe(
        SLURM_PROCID="0",
        SLURM_NTASKS="1",
        SLURM_STEP_NODELIST="nid[005252]",
        SLURM_JOB_NODELIST="other[1-4]",
    )
    assert env["MASTER_ADDR"] == "nid005252"
    env, _ = probe(
        SLURM_PROCID="0",
        SLURM_JOB_NODELIST="rack1-[2-3]-n[1-2]",
        MASTER_ADDR="10.0.0.1",
        MASTER_PORT="23456",
        SLURM_JOB_ID="99",
    )
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "23456")
    env, _ = probe(SLURM_PROCID="0", SLURM_JOB_NODELIST="rack1-[2-3]-n[1-2]")
    assert env["MASTER_ADDR"] == "rack1-2-n1"


def test_torchrun_context_hides_slurm_per_task_variables(probe: Any) -> None:
    env, _ = probe(
        TORCHELASTIC_RUN_ID="abc",
        RANK="5",
        WORLD_SIZE="8",
        LOCAL_RANK="1",
        LOCAL_WORLD_SIZE="4",
        GROUP_RANK="1",
        MASTER_ADDR="nid000042",
        MASTER_PORT="29400",
        SLURM_PROCID="1",
        SLURM_LOCALID="0",
        SLURM_NTASKS="2",
        SLURM_NPROCS="2",
        SLURM_NTASKS_PER_NODE="1",
        SLURM_TASKS_PER_NODE="1(x2)",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_STEP_TASKS_PER_NODE="1(x2)",
        SLURM_TASK_PID="4242",
        SLURM_GTIDS="1",
        SLURM_CPU_BIND="quiet,mask_cpu:0xff",
        SLURM_CPU_BIND_LIST="0xff",
        SLURM_JOB_ID="777",
        SLURM_NODEID="1",
        SLURM_JOB_NODELIST="nid[000041-000042]",
        SLURM_CPUS_PER_TASK="56",
    )
    assert [env[v] for v in RANK_VARS] == ["5", "8", "1", "4", "1"]
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("nid000042", "29400")
    assert not [name for name in env if name in bs.SLURM_PER_TASK]
    assert not [name for name in env if name.startswith("SLURM_CPU_BIND")]
    for name in ("SLURM_JOB_ID", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_CPUS_PER_TASK"):
        assert name in env


def test_node_name(tmp_path: Path) -> None:
    log = tmp_path / "logs"
    run_boot("true", env=base_env(HPCLAUNCH_LOG_DIR=str(log), SLURMD_NODENAME="nid001234"))
    assert exit_record(log, 0)["node"] == "nid001234"
    run_boot("true", env=base_env(HPCLAUNCH_LOG_DIR=str(log)))
    assert exit_record(log, 0)["node"] == socket.gethostname().split(".")[0]


# --- GPU visibility and caches --------------------------------------------------------


def test_gpu_per_task_picks_from_slurm_list(probe: Any) -> None:
    env, _ = probe(
        SLURM_PROCID="1",
        SLURM_NTASKS="2",
        SLURM_LOCALID="1",
        HPCLAUNCH_GPU_VISIBILITY="per-task",
        HPCLAUNCH_GPU_VARS="CUDA_VISIBLE_DEVICES,ROCR_VISIBLE_DEVICES",
        HPCLAUNCH_GPU_UNSET="HIP_VISIBLE_DEVICES",
        CUDA_VISIBLE_DEVICES="4,5",
        HIP_VISIBLE_DEVICES="0,1",
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "5"
    assert env["ROCR_VISIBLE_DEVICES"] == "1"  # nothing set before: LOCAL_RANK itself
    assert "HIP_VISIBLE_DEVICES" not in env


def test_gpu_per_task_under_torchrun_uses_its_local_rank(probe: Any) -> None:
    env, _ = probe(
        TORCHELASTIC_RUN_ID="x",
        RANK="2",
        WORLD_SIZE="4",
        LOCAL_RANK="2",
        LOCAL_WORLD_SIZE="4",
        GROUP_RANK="0",
        HPCLAUNCH_GPU_VISIBILITY="per-task",
        HPCLAUNCH_GPU_VARS="ROCR_VISIBLE_DEVICES",
        ROCR_VISIBLE_DEVICES="0,1,2,3,4,5,6,7",
    )
    assert env["ROCR_VISIBLE_DEVICES"] == "2"


def test_gpu_visibility_all_leaves_variables_alone(probe: Any) -> None:
    env, _ = probe(
        SLURM_PROCID="1",
        SLURM_LOCALID="1",
        HPCLAUNCH_GPU_VARS="CUDA_VISIBLE_DEVICES",
        HPCLAUNCH_GPU_UNSET="HIP_VISIBLE_DEVICES",
        CUDA_VISIBLE_DEVICES="4,5",
        HIP_VISIBLE_DEVICES="0",
    )
    assert (env["CUDA_VISIBLE_DEVICES"], env["HIP_VISIBLE_DEVICES"]) == ("4,5", "0")


def test_cache_dirs_created(probe: Any, tmp_path: Path) -> None:
    a, b = tmp_path / "miopen" / "db", tmp_path / "x" / "y" / "z"
    b.mkdir(parents=True)  # already there: fine
    probe(HPCLAUNCH_CACHE_DIRS=f"{a}::{b}")
    assert a.is_dir() and b.is_dir()


# --- arguments ------------------------------------------------------------------------


def test_arguments_reach_the_program_byte_identical(probe: Any) -> None:
    cases: list[tuple[str | bytes, bytes]] = [
        ("", b""),
        ("--flag", b"--flag"),
        ("-", b"-"),
        ("a b  c ", b"a b  c "),
        ("line1\nline2\n", b"line1\nline2\n"),
        ("$HOME `id` $(id) ; | & > *", b"$HOME `id` $(id) ; | & > *"),
        ("'single' \"double\" \\back", b"'single' \"double\" \\back"),
        ("ünïcødé ✓ 🚀", "ünïcødé ✓ 🚀".encode()),
        (b"raw\xff\xfe\x80bytes", b"raw\xff\xfe\x80bytes"),
        (b"\xff{rank}\xfe", b"\xff3\xfe"),
        ("--rank={rank}", b"--rank=3"),
        ("{{rank}}", b"{rank}"),
        ('{"a": 1}', b'{"a": 1}'),
        ("{x}", b"{x}"),
        ("{{x}}", b"{{x}}"),
        ("{node_rank}/{local_rank}/{local_world_size}", b"1/1/2"),
    ]
    _, argv = probe(
        *[arg for arg, _ in cases],
        SLURM_PROCID="3",
        SLURM_NTASKS="4",
        SLURM_LOCALID="1",
        SLURM_NODEID="1",
        SLURM_STEP_TASKS_PER_NODE="2(x2)",
    )
    assert argv == [want for _, want in cases]


def test_program_found_on_path_without_a_shell(tmp_path: Path) -> None:
    assert run_boot("true", env=base_env()).returncode == 0
    assert run_boot("false", env=base_env()).returncode == 1
    # `echo $HOME` as one word is a program name, not shell text
    assert run_boot("echo $HOME", env=base_env()).returncode == 127


# --- exit codes and signals -----------------------------------------------------------


def test_usage_without_program() -> None:
    proc = run_boot(env=base_env())
    assert proc.returncode == 2
    assert proc.stderr.decode().count("\n") == 1 and proc.stderr.startswith(b"usage:")


def test_exit_code_and_exit_file(tmp_path: Path) -> None:
    log = tmp_path / "logs"
    env = base_env(HPCLAUNCH_LOG_DIR=str(log), SLURM_PROCID="2", SLURMD_NODENAME="n1")
    before = time.time()
    proc = run_boot(PY, "-c", "import sys; sys.exit(3)", env=env)
    assert proc.returncode == 3
    record = exit_record(log, 2)
    assert {k: record[k] for k in ("rank", "node", "returncode")} == {
        "rank": 2,
        "node": "n1",
        "returncode": 3,
    }
    assert before <= record["time"] <= time.time()
    assert not [p for p in os.listdir(log) if ".tmp" in p]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGABRT])
def test_signal_death_is_passed_on(tmp_path: Path, sig: signal.Signals) -> None:
    log = tmp_path / "logs"
    code = f"import os; os.kill(os.getpid(), {int(sig)})"
    proc = run_boot(PY, "-c", code, env=base_env(HPCLAUNCH_LOG_DIR=str(log)))
    assert proc.returncode == -sig
    assert exit_record(log, 0)["returncode"] == -sig


def test_forwarded_signal_reaches_the_program_once(tmp_path: Path, waiter: Path) -> None:
    out = tmp_path / "got.json"
    boot = subprocess.Popen(
        boot_cmd(PY, str(waiter), str(out)), env=base_env(HPCLAUNCH_FORWARD_SIGNALS="1")
    )
    wait_for(Path(f"{out}.pid"))
    boot.send_signal(signal.SIGUSR1)  # to the bootstrap only, as torch < 2.2's agent does
    assert boot.wait(timeout=20) == 0
    assert json.loads(out.read_text()) == [signal.SIGUSR1]


def test_group_leader_leaves_signals_to_the_group(tmp_path: Path, waiter: Path) -> None:
    # torch >= 2.2 starts workers in a new session and signals the whole process group,
    # which reaches the program directly: forwarding as well would deliver it twice.
    out = tmp_path / "got.json"
    boot = subprocess.Popen(
        boot_cmd(PY, str(waiter), str(out)),
        env=base_env(HPCLAUNCH_FORWARD_SIGNALS="1"),
        start_new_session=True,
    )
    wait_for(Path(f"{out}.pid"))
    os.kill(boot.pid, signal.SIGUSR1)  # to the group leader alone: not passed on
    time.sleep(0.5)
    assert boot.poll() is None and not out.exists()
    os.killpg(boot.pid, signal.SIGUSR1)
    assert boot.wait(timeout=20) == 0
    assert json.loads(out.read_text()) == [signal.SIGUSR1]


def test_forwarded_term_kills_program_and_bootstrap_alike(tmp_path: Path, waiter: Path) -> None:
    out, log = tmp_path / "got.json", tmp_path / "logs"
    env = base_env(HPCLAUNCH_FORWARD_SIGNALS="1", HPCLAUNCH_LOG_DIR=str(log))
    boot = subprocess.Popen(boot_cmd(PY, str(waiter), str(out)), env=env)
    wait_for(Path(f"{out}.pid"))
    boot.send_signal(signal.SIGTERM)
    assert boot.wait(timeout=20) == -signal.SIGTERM
    assert exit_record(log, 0)["returncode"] == -signal.SIGTERM
    assert not out.exists()


def test_without_forwarding_the_bootstrap_outlives_signals(tmp_path: Path, waiter: Path) -> None:
    out, log = tmp_path / "got.json", tmp_path / "logs"
    boot = subprocess.Popen(
        boot_cmd(PY, str(waiter), str(out)), env=base_env(HPCLAUNCH_LOG_DIR=str(log))
    )
    pid_file = Path(f"{out}.pid")
    wait_for(pid_file)
    child = int(pid_file.read_text())
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        boot.send_signal(sig)
    time.sleep(0.5)
    assert boot.poll() is None, "the bootstrap died of a signal meant for the program"
    os.kill(child, 0)  # the program is alive and got nothing
    assert not out.exists()
    os.kill(child, signal.SIGUSR1)  # as Slurm would: to the program directly
    assert boot.wait(timeout=20) == 0
    assert json.loads(out.read_text()) == [signal.SIGUSR1]
    assert exit_record(log, 0)["returncode"] == 0


def test_program_gets_default_signal_dispositions() -> None:
    # Python ignores SIGPIPE/SIGXFSZ for itself; the program must not inherit that. Only
    # the classic signals 1-31 are compared: glibc's posix_spawn (as used by Rust's Command
    # and by subprocess itself when it can) leaves its internal signals 32/33 ignored,
    # which glibc and musl programs reinstall for themselves.
    def ignored(argv: list[str | bytes]) -> int:
        out = subprocess.run(argv, env=base_env(), capture_output=True, check=True).stdout
        line = next(li for li in out.decode().splitlines() if li.startswith("SigIgn"))
        return int(line.split()[1], 16) & 0x7FFFFFFF

    direct = ignored(["grep", "SigIgn", "/proc/self/status"])
    assert ignored(boot_cmd("grep", "SigIgn", "/proc/self/status")) == direct


# --- logs -----------------------------------------------------------------------------


def test_logs_and_ranks_tsv(tmp_path: Path) -> None:
    log = tmp_path / "logs"
    env = base_env(
        HPCLAUNCH_LOG_DIR=str(log),
        SLURM_PROCID="3",
        SLURM_LOCALID="1",
        SLURM_NTASKS="4",
        SLURMD_NODENAME="nid000001",
    )
    code = "import sys; print('out', sys.argv[1]); print('err', file=sys.stderr)"
    pids = []
    for _ in range(2):  # twice: everything is appended, nothing truncated
        boot = subprocess.Popen(
            boot_cmd(PY, "-c", code, "{rank}"),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        stdout, stderr = boot.communicate(timeout=60)
        assert (boot.returncode, stdout, stderr) == (0, b"", b"")
        pids.append(boot.pid)
    assert (log / "rank-3.out").read_text() == "out 3\nout 3\n"
    assert (log / "rank-3.err").read_text() == "err\nerr\n"
    assert (log / "ranks.tsv").read_text() == "".join(f"3\tnid000001\t1\t{p}\n" for p in pids)
    assert exit_record(log, 3)["returncode"] == 0


def test_eight_ranks_at_once(tmp_path: Path) -> None:
    log = tmp_path / "run" / "logs"
    caches = [tmp_path / "tmp" / "miopen" / "a", tmp_path / "tmp" / "miopen" / "b"]
    procs = []
    for rank in range(8):
        env = base_env(
            HPCLAUNCH_LOG_DIR=str(log),
            HPCLAUNCH_CACHE_DIRS=":".join(map(str, caches)),
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NTASKS="8",
            SLURMD_NODENAME="n0",
        )
        procs.append(
            subprocess.Popen(boot_cmd("echo", "rank {rank}"), env=env, stderr=subprocess.PIPE)
        )
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert (proc.returncode, err) == (0, b"")
    assert all(c.is_dir() for c in caches)
    lines = (log / "ranks.tsv").read_text().splitlines()
    assert sorted(line.split("\t")[0] for line in lines) == [str(r) for r in range(8)]
    assert all(len(line.split("\t")) == 4 for line in lines)
    for rank in range(8):
        assert (log / f"rank-{rank}.out").read_text() == f"rank {rank}\n"
        assert exit_record(log, rank)["returncode"] == 0


def test_unusable_log_dir_still_runs_the_program(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    proc = run_boot("echo", "hi", env=base_env(HPCLAUNCH_LOG_DIR=str(tmp_path / "file" / "logs")))
    assert (proc.returncode, proc.stdout) == (0, b"hi\n")
    assert proc.stderr.startswith(b"hpclaunch-bootstrap: cannot write logs in ")


# --- programs that cannot start -------------------------------------------------------


def test_missing_program(tmp_path: Path) -> None:
    log = tmp_path / "logs"
    proc = run_boot("no-such-program-xyz", "--x", env=base_env(HPCLAUNCH_LOG_DIR=str(log)))
    line = b"hpclaunch-bootstrap: no-such-program-xyz: command not found\n"
    # With a log folder the line goes to the rank's log only (that is what gets streamed),
    # so a user following the job sees it once.
    assert (proc.returncode, proc.stdout, proc.stderr) == (127, b"", b"")
    assert (log / "rank-0.err").read_bytes() == line
    assert exit_record(log, 0)["returncode"] == 127


def test_program_not_executable(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    proc = run_boot(str(script), env=base_env())
    assert proc.returncode == 126
    assert proc.stderr == f"hpclaunch-bootstrap: {script}: permission denied\n".encode()


# --- interpreters and speed -----------------------------------------------------------


def test_runs_on_python38(tmp_path: Path) -> None:
    python = python_of("3.8")
    if python is None:
        pytest.skip("no python3.8 here")
    log = tmp_path / "logs"
    env = base_env(HPCLAUNCH_LOG_DIR=str(log), SLURM_PROCID="1", SLURM_NTASKS="2")
    proc = run_boot("sh", "-c", 'echo "$RANK/$WORLD_SIZE {rank}"; exit 4', env=env, python=python)
    assert proc.returncode == 4
    assert (log / "rank-1.out").read_text() == "1/2 1\n"
    assert exit_record(log, 1)["returncode"] == 4


def test_overhead_information(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Prints the bootstrap's cost per rank; information only, never a timed assertion.
    Both forms: run as a script (compiled at every start) and as a run folder ships it
    (the loader importing the bootstrap from bytecode cached at the first start), the
    form every rank runs and bench/launch.py measures."""

    def median_ms(argv: list[str | bytes], n: int = 15) -> float:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            subprocess.run(argv, env=base_env(), check=True)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1000

    direct = median_ms(["true"])
    interp = median_ms([PY, "-I", "-S", "-c", "pass"])
    script = median_ms(boot_cmd("true"))
    for source in (node.LOADER, node.BOOTSTRAP):  # the run folder's layout (launching)
        shutil.copyfile(node.path(source), tmp_path / node.RUN_DIR_NAME[source])
    loader = tmp_path / node.RUN_DIR_NAME[node.LOADER]
    shipped = median_ms([BOOT_PY, *node.PYTHON_FLAGS, str(loader), "true"])
    with capsys.disabled():
        print(
            f"\n[bootstrap overhead] true: {direct:.1f} ms, python -I -S: {interp:.1f} ms, "
            f"bootstrap true as shipped: {shipped:.1f} ms (+{shipped - direct:.1f} ms per "
            f"rank), as a script: {script:.1f} ms"
        )


def test_program_line_from_hpclaunch_argv(tmp_path: Path) -> None:
    """srun splits at a lone ':'; hpclaunch then sends the program line hex-encoded."""
    program = [
        sys.executable,
        "-c",
        "import sys, os; print(sys.argv[1:], 'HPCLAUNCH_ARGV' in os.environ)",
        ":",
        "",
        "a b",
    ]
    encoded = ",".join(os.fsencode(a).hex() for a in program)
    proc = run_boot(env=base_env(HPCLAUNCH_ARGV=encoded))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"[':', '', 'a b'] False\n"


# --- --profile-ranks/--profiler: the chosen ranks' program under the profiler -----------

# A stand-in for nsys/rocprof: logs its argv, runs the command after its 3 own words and,
# like a real profiler, exits 0 whatever the program did (FAKE_FAIL: exits 1 at once).
FAKE_PROFILER = """#!{python}
import json, os, subprocess, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(sys.argv) + "\\n")
if os.environ.get("FAKE_FAIL"):
    sys.exit(1)
subprocess.call(sys.argv[4:])
"""


@pytest.fixture
def fake_profilers(tmp_path: Path) -> Path:
    """A folder holding fake `nsys` and `rocprof`, to put in front of PATH."""
    folder = tmp_path / "fakebin"
    folder.mkdir()
    for name in ("nsys", "rocprof"):
        path = folder / name
        path.write_text(FAKE_PROFILER.format(python=PY))
        path.chmod(0o755)
    return folder


def _profile_env(tmp_path: Path, fakes: Path, tool: str, rank: int, **extra: str) -> dict[str, str]:
    env = base_env(
        PATH=f"{fakes}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        FAKE_LOG=str(tmp_path / "fake.log"),
        HPCLAUNCH_LOG_DIR=str(tmp_path / "logs"),
        HPCLAUNCH_PROFILER=tool,
        HPCLAUNCH_PROFILE_RANKS="0,1",
        HPCLAUNCH_PROFILE_DIR=str(tmp_path / "profiles"),
        SLURM_PROCID=str(rank),
        SLURM_NTASKS="4",
    )
    env.update(extra)
    return env


def _fake_calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "fake.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize(
    ("tool", "words"),
    [
        ("nsys", ["profile", "--output={dir}/rank-1", "--force-overwrite=true"]),
        ("rocprof", ["--stats", "-o", "{dir}/rank-1.csv"]),
    ],
)
def test_a_chosen_rank_runs_under_the_profiler_and_keeps_its_exit_code(
    tmp_path: Path, fake_profilers: Path, tool: str, words: list[str]
) -> None:
    env = _profile_env(tmp_path, fake_profilers, tool, 1)
    code = "import os, sys; print(os.environ['HPCLAUNCH_PROFILE']); sys.exit(3)"
    proc = run_boot(PY, "-c", code, env=env)
    assert proc.returncode == 3  # the fake profiler exited 0: the program's code wins
    assert exit_record(tmp_path / "logs", 1)["returncode"] == 3
    [call] = _fake_calls(tmp_path)
    profiles = str(tmp_path / "profiles")
    assert call[1:4] == [w.format(dir=profiles) for w in words]
    # Between profiler and program: the bootstrap's own file, only to learn the status.
    assert call[4:7] == [sys.executable if BOOT_PY == PY else call[4], "-I", "-S"]
    assert call[7] == str(BOOTSTRAP) and call[8].startswith("--hpclaunch-child=")
    assert call[9:] == [PY, "-c", code]
    assert (tmp_path / "logs" / "rank-1.out").read_text() == "1\n"
    assert not [p for p in os.listdir(tmp_path / "profiles") if "status" in p]


def test_a_rank_not_chosen_runs_bare(tmp_path: Path, fake_profilers: Path) -> None:
    env = _profile_env(tmp_path, fake_profilers, "nsys", 2)
    proc = run_boot(PY, "-c", "import os; print(os.environ['HPCLAUNCH_PROFILE'])", env=env)
    assert proc.returncode == 0 and _fake_calls(tmp_path) == []
    assert (tmp_path / "logs" / "rank-2.out").read_text() == "0\n"


def test_a_signal_death_under_the_profiler_is_passed_on(
    tmp_path: Path, fake_profilers: Path
) -> None:
    env = _profile_env(tmp_path, fake_profilers, "nsys", 0)
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    proc = run_boot(PY, "-c", code, env=env)
    assert proc.returncode == -signal.SIGTERM
    assert exit_record(tmp_path / "logs", 0)["returncode"] == -signal.SIGTERM


def test_a_missing_program_under_the_profiler_is_127_once(
    tmp_path: Path, fake_profilers: Path
) -> None:
    env = _profile_env(tmp_path, fake_profilers, "rocprof", 0)
    proc = run_boot("no-such-program-hpclaunch", env=env)
    assert proc.returncode == 127
    err = (tmp_path / "logs" / "rank-0.err").read_text()
    assert err.count("command not found") == 1, err


def test_a_missing_profiler_is_one_line_and_the_rank_runs(tmp_path: Path) -> None:
    env = _profile_env(tmp_path, tmp_path / "nowhere", "nsys", 1, PATH="/usr/bin:/bin")
    proc = run_boot(PY, "-c", "import sys; print('ran'); sys.exit(4)", env=env)
    assert proc.returncode == 4
    assert (tmp_path / "logs" / "rank-1.out").read_text() == "ran\n"
    [line] = (tmp_path / "logs" / "rank-1.err").read_text().splitlines()
    assert line.startswith("hpclaunch-bootstrap: rank 1 runs without nsys: nsys is not found")


def test_a_profiler_that_fails_first_leaves_the_program_unprofiled(
    tmp_path: Path, fake_profilers: Path
) -> None:
    env = _profile_env(tmp_path, fake_profilers, "nsys", 0, FAKE_FAIL="1")
    proc = run_boot(PY, "-c", "import sys; print('ran'); sys.exit(5)", env=env)
    assert proc.returncode == 5 and len(_fake_calls(tmp_path)) == 1
    assert (tmp_path / "logs" / "rank-0.out").read_text() == "ran\n"
    [line] = (tmp_path / "logs" / "rank-0.err").read_text().splitlines()
    assert "before it started the program, which runs unprofiled" in line


def test_torch_profiler_is_told_through_variables(probe: Any, tmp_path: Path) -> None:
    folder = tmp_path / "profiles"
    common = {"HPCLAUNCH_PROFILER": "torch", "HPCLAUNCH_PROFILE_RANKS": "1"}
    env, _ = probe(SLURM_PROCID="1", HPCLAUNCH_PROFILE_DIR=str(folder), **common)
    assert env["HPCLAUNCH_PROFILE"] == "1" and env["HPCLAUNCH_PROFILE_DIR"] == str(folder)
    assert folder.is_dir()  # made for the program's own trace handler
    env, _ = probe(SLURM_PROCID="0", HPCLAUNCH_PROFILE_DIR=str(folder), **common)
    assert env["HPCLAUNCH_PROFILE"] == "0"
    env, _ = probe(SLURM_PROCID="0")
    assert "HPCLAUNCH_PROFILE" not in env


PYSPY = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "py-spy"
HOT = """
import sys, time
def profiled_hot_loop(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(2000))
print("started", flush=True)
profiled_hot_loop(float(sys.argv[1]))
sys.exit(6)
"""


@pytest.mark.skipif(not PYSPY.exists(), reason="py-spy is not installed in .venv")
def test_pyspy_records_the_program_not_the_bootstrap(tmp_path: Path) -> None:
    script = tmp_path / "hot.py"
    script.write_text(HOT)
    env = _profile_env(tmp_path, tmp_path, "py-spy", 0, HPCLAUNCH_PYSPY=str(PYSPY))
    proc = run_boot(PY, str(script), "1.5", env=env)
    assert proc.returncode == 6
    profile = json.loads((tmp_path / "profiles" / "rank-0.speedscope.json").read_text())
    frames = profile["shared"]["frames"]
    assert "profiled_hot_loop" in {frame["name"] for frame in frames}
    # The copy of the bootstrap that keeps the exit status may show in its first
    # milliseconds (its start-up), never beyond: the samples are the program's.
    ours = {i for i, f in enumerate(frames) if f.get("file", "").endswith("bootstrap.py")}
    samples = [s for p in profile["profiles"] for s in p["samples"]]
    assert len([s for s in samples if ours & set(s)]) <= max(3, len(samples) // 20)


@pytest.mark.skipif(not PYSPY.exists(), reason="py-spy is not installed in .venv")
def test_pyspy_profile_survives_sigterm_to_the_whole_task(tmp_path: Path) -> None:
    # Slurm's time limit and scancel signal every process of the task: py-spy too.
    script = tmp_path / "hot.py"
    script.write_text(HOT)
    env = _profile_env(tmp_path, tmp_path, "py-spy", 0, HPCLAUNCH_PYSPY=str(PYSPY))
    boot = subprocess.Popen(boot_cmd(PY, str(script), "60"), env=env, start_new_session=True)
    wait_for(tmp_path / "logs" / "rank-0.out")
    deadline = time.monotonic() + 20
    while "started" not in (tmp_path / "logs" / "rank-0.out").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(1.0)
    os.killpg(boot.pid, signal.SIGTERM)
    assert boot.wait(timeout=30) == -signal.SIGTERM
    profile = (tmp_path / "profiles" / "rank-0.speedscope.json").read_text()
    assert "profiled_hot_loop" in profile


# --- --nccl-debug: each rank's NCCL_DEBUG_FILE moved into <logs>/nccl/rank-R.txt -------


@pytest.mark.parametrize(
    ("pattern", "name"),
    [
        ("/tmp/u-rccl-%h-%p.txt", "/tmp/u-rccl-nid5-42.txt"),
        ("/tmp/a%%b-%x-%", "/tmp/a%b-%x-%"),
        ("plain", "plain"),
    ],
)
def test_nccl_file_is_named_as_nccl_names_it(pattern: str, name: str) -> None:
    assert bs.nccl_file(pattern, "nid5", 42) == name


WRITER = """
import os, socket, sys
name = os.environ["NCCL_DEBUG_FILE"].replace("%h", socket.gethostname().split(".")[0])
with open(name.replace("%p", str(os.getpid())), "w") as f:
    f.write("debug of rank %s\\n" % os.environ["RANK"])
code = int(sys.argv[1])
if code < 0:
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


@pytest.mark.parametrize("code", [0, 3, -signal.SIGTERM])
def test_nccl_debug_file_moves_into_the_logs(tmp_path: Path, code: int) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    local = tmp_path / "node-tmp"
    local.mkdir()
    env = base_env(
        HPCLAUNCH_LOG_DIR=str(tmp_path / "logs"),
        HPCLAUNCH_NCCL_COLLECT="1",
        NCCL_DEBUG_FILE=f"{local}/u-nccl-%h-%p.txt",
        SLURM_PROCID="3",
        SLURM_NTASKS="4",
    )
    proc = run_boot(PY, str(script), str(code), env=env)
    assert proc.returncode == code
    copied = tmp_path / "logs" / "nccl" / "rank-3.txt"
    assert copied.read_text() == "debug of rank 3\n"
    assert list(local.iterdir()) == []  # the node-local file is gone


def test_nccl_debug_file_stays_without_the_switch(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = base_env(
        HPCLAUNCH_LOG_DIR=str(tmp_path / "logs"), NCCL_DEBUG_FILE=f"{tmp_path}/n-%h-%p.txt"
    )
    assert run_boot(PY, str(script), "0", env=env).returncode == 0
    assert len(list(tmp_path.glob("n-*.txt"))) == 1
    assert not (tmp_path / "logs" / "nccl").exists()


def test_always_forwarding_passes_signals_on_as_a_group_leader(
    tmp_path: Path, waiter: Path
) -> None:
    # podman: the container's first process (the bootstrap) may lead its own session, yet
    # `podman run` passes Slurm's signal to it alone: it must reach the program.
    out = tmp_path / "got.json"
    boot = subprocess.Popen(
        boot_cmd(PY, str(waiter), str(out)),
        env=base_env(HPCLAUNCH_FORWARD_SIGNALS="always"),
        start_new_session=True,
    )
    wait_for(Path(f"{out}.pid"))
    os.kill(boot.pid, signal.SIGUSR1)  # to the bootstrap alone, as podman's proxy does
    assert boot.wait(timeout=20) == 0
    assert json.loads(out.read_text()) == [signal.SIGUSR1]


def test_always_forwarding_ends_the_program_when_its_task_is_killed(
    tmp_path: Path, waiter: Path
) -> None:
    # podman: srun SIGKILLs `podman run` (SLURM_TASK_PID) and the container runs on under
    # conmon; the bootstrap inside sees its task gone and ends the program within seconds.
    out = tmp_path / "got.json"
    task = subprocess.Popen(["sleep", "60"])
    env = base_env(HPCLAUNCH_FORWARD_SIGNALS="always", SLURM_TASK_PID=str(task.pid))
    boot = subprocess.Popen(boot_cmd(PY, str(waiter), str(out)), env=env)
    try:
        wait_for(Path(f"{out}.pid"))
        time.sleep(1.5)  # a few of the bootstrap's checks, with the task alive
        assert boot.poll() is None
        task.kill()
        task.wait()
        assert boot.wait(timeout=10) == -signal.SIGKILL
    finally:
        task.kill()
        boot.kill()
