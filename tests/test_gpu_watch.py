"""The GPU watch (src/hpclaunch/node/gpu_watch.py) and its GPU tool stand-ins
(tests/doubles/gpu: nvidia-smi, rocm-smi), without Slurm.

There are no GPUs on this machine or on the testbed, so the stand-ins answer nvidia-smi's
and rocm-smi's command lines in the formats their documentation and recorded real output
show (each stand-in's docstring cites its sources; the recorded lines are quoted below),
with readings scripted by a pattern file. What they cannot show:

- the real tools' readings and timing: what utilization.gpu or "GPU use (%)" reports for
  a real data-starved job (a rank waiting in a NCCL/RCCL collective may read busy), how
  long a real rocm-smi call takes (often most of a second), how nvidia-smi's loop paces
  and flushes on a real node, the driver's errors;
- amd-smi: no stand-in; its JSON is parsed here from the shapes its source prints;
- what a node shows under Slurm: GPU visibility in a step's cgroup (`srun --overlap`),
  MIG, a real MI250X's secondary die (only as rocm_smi.py prints it), and the CPU the
  watch costs beside real ranks.
"""

from __future__ import annotations

import glob
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from hpclaunch.node import gpu_watch
from hpclaunch.node.gpu_watch import ALL_IDLE, SOME_IDLE, Row, analyze, warning
from pythons import python_of

REPO = Path(__file__).resolve().parents[1]
GPU_DOUBLES = REPO / "tests" / "doubles" / "gpu"
WATCH = Path(gpu_watch.__file__)
MIB = 1024 * 1024

# Recorded by the nvidia_gpu_exporter project on an H100 80GB HBM3, driver 590.48.01
# (github.com/utkuozdemir/nvidia_gpu_exporter, internal/captures/
# linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt, "load :: query-gpu"), the columns
# name, index, utilization.gpu, memory.used, power.draw of its `--format=csv` header and
# row, and its `nvidia-smi -L` line.
H100_HEADER = "name, index, utilization.gpu [%], memory.used [MiB], power.draw [W]"
H100_ROW = "NVIDIA H100 80GB HBM3, 0, 100 %, 19818 MiB, 631.95 W"
H100_LIST = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)"
# utilization.gpu of the same driver's H100 in MIG mode (..._nvidia-h100-mig__590.48.01).
MIG_BUSY = "[N/A]"
# An MI250's two GCDs as rocm-smi --json printed them (TorchServe's ROCmUtilTest,
# github.com/pytorch/serve): the values the rocm-smi stand-in must print the same way.
MI250 = [
    {"power": "102.0", "use": "50", "total": "68702699520", "used": "51527024640"},
    {"power": "N/A (Secondary die)", "use": "0", "total": "68702699520", "used": "11665408"},
]


# The watch runs with the nodes' own python3: 3.6 on LUMI (SLES), as the stage guard does.
PYTHONS = [pytest.param(sys.executable, id="current")] + [
    pytest.param(python_of(v) or "", id=f"python{v}", marks=pytest.mark.skipif(
        python_of(v) is None, reason=f"no python{v} here"))
    for v in ("3.6", "3.8")
]  # fmt: skip


def _env(tmp_path: Path, gpus: list[dict[str, Any]], **extra: Any) -> dict[str, str]:
    """An environment whose stand-ins read these GPUs (and `extra` pattern keys)."""
    pattern = tmp_path / "pattern.json"
    pattern.write_text(json.dumps({"gpus": gpus, **extra}))
    return {
        "PATH": f"{GPU_DOUBLES}:/usr/bin:/bin",
        "HPCLAUNCH_FAKE_GPU_PATTERN": str(pattern),
        "HPCLAUNCH_FAKE_GPU_STATE": str(tmp_path / "state"),
        "SLURMD_NODENAME": "node1",
    }


def _tool(name: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GPU_DOUBLES / name), *args], env=env, capture_output=True, text=True, timeout=30
    )


def _only(tmp_path: Path, name: str) -> str:
    """A PATH folder holding just this stand-in (a node that has only rocm-smi)."""
    folder = tmp_path / f"only-{name}"
    folder.mkdir(exist_ok=True)
    (folder / name).symlink_to(GPU_DOUBLES / name)
    return f"{folder}:/usr/bin:/bin"


# ----------------------------------------------------------------------------- stand-ins
def test_nvidia_smi_prints_the_recorded_format(tmp_path: Path) -> None:
    env = _env(tmp_path, [{"samples": [[100, 19818, 631.95]]}, {"samples": [[None, 59, 71.15]]}])
    query = "--query-gpu=name,index,utilization.gpu,memory.used,power.draw"
    done = _tool("nvidia-smi", [query, "--format=csv"], env)
    lines = done.stdout.splitlines()
    assert (done.returncode, lines[:2]) == (0, [H100_HEADER, H100_ROW])
    assert lines[2] == f"NVIDIA H100 80GB HBM3, 1, {MIG_BUSY}, 59 MiB, 71.15 W"
    query = "--query-gpu=" + gpu_watch.NVIDIA_QUERY
    done = _tool("nvidia-smi", [query, "--format=csv,noheader,nounits"], env)
    assert done.stdout == "0, 100, 19818, 631.95\n1, [N/A], 59, 71.15\n"
    assert _tool("nvidia-smi", ["-L"], env).stdout.splitlines()[0] == H100_LIST
    refused = _tool("nvidia-smi", ["-q"], env)
    assert refused.returncode == 2 and "stand-in" in refused.stderr


def test_nvidia_smi_loops_one_line_per_gpu_per_iteration(tmp_path: Path) -> None:
    samples = [[1, 10, 1.0], [2, 20, 2.0], [3, 30, 3.5]]
    env = _env(tmp_path, [{"samples": samples}, {"samples": [[None, 5, "[Not Supported]"]]}])
    argv = [str(GPU_DOUBLES / "nvidia-smi"), "--query-gpu=" + gpu_watch.NVIDIA_QUERY]
    argv += ["--format=csv,noheader,nounits", "-lms", "20"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(8)]
    proc.kill()
    proc.wait()
    assert lines == [
        "0, 1, 10, 1.00\n", "1, [N/A], 5, [Not Supported]\n",
        "0, 2, 20, 2.00\n", "1, [N/A], 5, [Not Supported]\n",
        "0, 3, 30, 3.50\n", "1, [N/A], 5, [Not Supported]\n",
        "0, 1, 10, 1.00\n", "1, [N/A], 5, [Not Supported]\n",
    ]  # fmt: skip


def test_rocm_smi_prints_rocm_smis_json(tmp_path: Path) -> None:
    gpus = [
        {"samples": [[50, 51527024640 / MIB, 102.0], [0, 1, 95.5]]},
        {"samples": [[0, 11665408 / MIB, None]], "secondary": True},
    ]
    env = _env(tmp_path, gpus)
    args = ["--showpower", "--showuse", "--showmeminfo", "vram", "--json"]
    first, second = (_tool("rocm-smi", args, env) for _ in range(2))
    # rocm_smi.py: print(json.dumps(JSON_DATA)); per card showPower, showGpuUse (GPU use,
    # then the GFX Activity counter: the stand-in's is its busy percents summed x 1000),
    # showMemInfo; the values as strings.
    expected = {
        f"card{i}": {
            "Average Graphics Package Power (W)": gcd["power"],
            "GPU use (%)": gcd["use"],
            "GFX Activity": str(int(gcd["use"]) * 1000),
            "VRAM Total Memory (B)": gcd["total"],
            "VRAM Total Used Memory (B)": gcd["used"],
        }
        for i, gcd in enumerate(MI250)
    }
    assert (first.returncode, first.stdout) == (0, json.dumps(expected) + "\n")
    # One call, one sample: the second call reads the pattern's next sample.
    card0 = json.loads(second.stdout)["card0"]
    assert (card0["Average Graphics Package Power (W)"], card0["GPU use (%)"]) == ("95.5", "0")
    assert card0["VRAM Total Used Memory (B)"] == str(MIB)
    shown = json.loads(_tool("rocm-smi", ["--showid", "--json"], env).stdout)
    keys = ["Device Name", "Device ID", "Device Rev", "Subsystem ID", "GUID"]
    assert list(shown["card0"]) == keys
    refused = _tool("rocm-smi", ["--showuse"], env)  # the human-readable output
    assert refused.returncode == 2 and "stand-in" in refused.stderr


# ----------------------------------------------------------------------------- parsers
def test_parsers_read_the_stand_ins(tmp_path: Path) -> None:
    env = _env(tmp_path, [{"samples": [[97, 1234, 456.78]]}, {"samples": [[None, None, None]]}])
    query = ["--query-gpu=" + gpu_watch.NVIDIA_QUERY, "--format=csv,noheader,nounits"]
    nvidia = gpu_watch.parse_nvidia(_tool("nvidia-smi", query, env).stdout)
    assert [r[2:] for r in nvidia] == [(0, 97, 1234, 456.78), (1, None, None, None)]
    # With units and a header too (--format=csv): the same readings.
    units = gpu_watch.parse_nvidia(_tool("nvidia-smi", [query[0], "--format=csv"], env).stdout)
    assert units == nvidia
    secondary = {"samples": [[0, 11.125, None]], "secondary": True}
    env = _env(tmp_path, [{"samples": [[50, 49140, 102]]}, secondary])
    rocm = _tool("rocm-smi", gpu_watch.ONE_SHOT["rocm-smi"], env).stdout
    expected = [(0, 50, 49140, 102), (1, 0, 11.125, None)]
    assert [r[2:] for r in gpu_watch.parse_json(rocm)] == expected


def test_parse_json_reads_amd_smi_and_renamed_keys() -> None:
    # amd-smi metric --usage --power --mem-usage --json, as amdsmi_commands.py builds it
    # (ROCm/amdsmi: "usage"/"gfx_activity" in %, "power"/"socket_power" in W, "N/A" where
    # a reading fails, "mem_usage"/"used_vram" in MB = bytes // 2**20) and amdsmi_logger.py
    # prints it (json.dumps(list, indent=4)); ROCm 7 wraps the list as {"gpu_data": [...]}.
    usage = {"gfx_activity": {"value": 87, "unit": "%"}, "umc_activity": {"value": 3, "unit": "%"}}
    power = {"socket_power": {"value": 412, "unit": "W"}, "power_management": "ENABLED"}
    memory = {
        "total_vram": {"value": 65520, "unit": "MB"},
        "used_vram": {"value": 4096, "unit": "MB"},
    }
    gcd0 = {"gpu": 0, "usage": usage, "power": power, "mem_usage": memory}
    gcd1 = {"gpu": 1, "usage": {"gfx_activity": {"value": 0, "unit": "%"}},
            "power": {"socket_power": "N/A"}, "mem_usage": "N/A"}  # fmt: skip
    expected = [(0, 87, 4096, 412), (1, 0, None, None)]
    for text in (json.dumps([gcd0, gcd1], indent=4), json.dumps({"gpu_data": [gcd0, gcd1]})):
        assert [r[2:] for r in gpu_watch.parse_json(text)] == expected
    # amd-smi of ROCm 6.0: bare values; rocm-smi of ROCm 6 on MI300: "Current Socket";
    # a warning printed before the JSON.
    flat = [{"gpu": 0, "usage": {"gfx_activity": 12}, "power": {"average_socket_power": 99}}]
    assert [r[2:] for r in gpu_watch.parse_json(json.dumps(flat))] == [(0, 12, None, 99)]
    mi300 = {
        "card0": {
            "Current Socket Graphics Package Power (W)": "741.0",
            "GPU use (%)": "100",
            "GFX Activity": "123456789",
            "VRAM Total Used Memory (B)": str(2 * MIB),
        }
    }
    text = "WARNING: something\n" + json.dumps(mi300)
    assert [r[2:] for r in gpu_watch.parse_json(text)] == [(0, 100, 2, 741)]
    # rocm-smi's GFX Activity is a counter, never the busy percent.
    counter = {"card0": {"GFX Activity": "81364057"}}
    assert gpu_watch.parse_json(json.dumps(counter))[0].busy_pct is None
    assert gpu_watch.parse_json("not json") == gpu_watch.parse_json("") == []


@pytest.mark.parametrize(
    "value, expected",
    [("35", 35.0), ("35 %", 35.0), ("631.95 W", 631.95), (12, 12.0), ("[N/A]", None),
     ("[Not Supported]", None), ("N/A (Secondary die)", None), ("", None), (None, None),
     (True, None), ("[Unknown Error]", None)],
)  # fmt: skip
def test_number(value: Any, expected: Optional[float]) -> None:
    assert gpu_watch.number(value) == expected


def test_csv_round_trip_skips_damage(tmp_path: Path) -> None:
    rows = [Row(1.5, "n1", 0, 97.0, 1234.0, 456.78), Row(1.5, "n1", 1, None, 11.125, None)]
    path = tmp_path / "gpu-n1.csv"
    text = gpu_watch.HEADER + gpu_watch.csv_lines(rows)
    assert text.splitlines()[1:] == ["1.500,n1,0,97,1234,456.78", "1.500,n1,1,,11.12,"]
    path.write_text(text + "garbage\n" + gpu_watch.HEADER + "2.0,n1,0,5,1")  # the last cut
    assert gpu_watch.read_csv(str(path)) == [rows[0], rows[1]._replace(mem_mib=11.12)]


# ----------------------------------------------------------------------------- the sampler
def _watch(python: str, env: dict[str, str], out: Path, *args: str) -> subprocess.Popen[str]:
    argv = [python, "-I", "-S", str(WATCH), "--out", str(out / "metrics" / "gpu-{node}.csv")]
    return subprocess.Popen(
        [*argv, "--interval", "0.05", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _rows_once(path: Path, count: int, proc: subprocess.Popen[str]) -> list[Row]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        rows = gpu_watch.read_csv(str(path)) if path.exists() else []
        if len(rows) >= count:
            return rows
        time.sleep(0.05)
    raise AssertionError(f"{path}: fewer than {count} rows; {proc.communicate()}")


def _alive_with(marker: str) -> list[int]:
    """Processes whose environment holds `marker` (a stand-in left behind)."""
    found = []
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            if marker.encode() in Path(environ).read_bytes():
                found.append(int(environ.split("/")[2]))
        except OSError:
            pass
    return found


@pytest.mark.parametrize("python", PYTHONS)
def test_watch_samples_nvidia_smis_loop(python: str, tmp_path: Path) -> None:
    busy = [[95, 40000, 650.5], [0, 40000, 90.0], [88, 40001, 600.25]]
    env = _env(tmp_path, [{"samples": [[100, 1, 500.0]]}, {"samples": busy}])
    proc = _watch(python, env, tmp_path, "--stop-file", str(tmp_path / "stop"))
    rows = _rows_once(tmp_path / "metrics" / "gpu-node1.csv", 14, proc)
    (tmp_path / "stop").touch()
    assert proc.wait(timeout=10) == 0
    assert proc.communicate() == ("", "")
    lines = (tmp_path / "metrics" / "gpu-node1.csv").read_text().splitlines()
    assert lines[0] == "time,node,gpu,busy_pct,mem_mib,power_w"
    assert lines.count(lines[0]) == 1
    gpu1 = [r for r in rows if r.gpu == 1]
    assert [r[3:] for r in gpu1[:6]] == [tuple(map(float, s)) for s in busy * 2]
    assert all(r.node == "node1" for r in rows)
    # One time per sample, both GPUs in it, in order.
    times = [r.time for r in rows]
    assert times == sorted(times) and [r.time for r in rows[0::2]] == [r.time for r in rows[1::2]]
    assert not _alive_with(env["HPCLAUNCH_FAKE_GPU_PATTERN"])  # nvidia-smi ended too


@pytest.mark.parametrize("python", PYTHONS)
def test_watch_calls_rocm_smi_once_per_sample(python: str, tmp_path: Path) -> None:
    gpus = [
        {"samples": [[90, 100, 400.0], [5, 100, 120.0]]},
        {"samples": [[80, 50, None]], "secondary": True},
    ]
    env = dict(_env(tmp_path, gpus), PATH=_only(tmp_path, "rocm-smi"))
    proc = _watch(python, env, tmp_path)
    rows = _rows_once(tmp_path / "metrics" / "gpu-node1.csv", 8, proc)
    proc.send_signal(signal.SIGUSR1)  # the batch script's "the ranks are done"
    assert proc.wait(timeout=10) == 0
    assert proc.communicate()[1] == ""
    gpu0 = [r[3:] for r in rows if r.gpu == 0]
    assert gpu0[:4] == [(90, 100, 400), (5, 100, 120), (90, 100, 400), (5, 100, 120)]
    assert {r[3:] for r in rows if r.gpu == 1} == {(80, 50, None)}
    calls = int((tmp_path / "state" / "rocm-smi-node1.count").read_text())
    assert calls >= len(rows) // 2


def test_two_nodes_each_get_their_own_csv(tmp_path: Path) -> None:
    nodes = {"node1": [{"samples": [[11, 1, 1.0]]}], "node2": [{"samples": [[22, 2, 2.0]]}]}
    env = _env(tmp_path, [], nodes=nodes)
    procs = {n: _watch(sys.executable, dict(env, SLURMD_NODENAME=n), tmp_path) for n in nodes}
    for name, proc in procs.items():
        rows = _rows_once(tmp_path / "metrics" / f"gpu-{name}.csv", 3, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        expected = nodes[name][0]["samples"][0]
        assert {(r.node, *r[2:]) for r in rows} == {(name, 0, *map(float, expected))}


def test_no_tool_says_so_once_and_exits_0(tmp_path: Path) -> None:
    env = dict(_env(tmp_path, []), PATH="/usr/bin:/bin")
    proc = _watch(sys.executable, env, tmp_path)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (0, "")
    assert err == (
        "hpclaunch: gpu watch: no nvidia-smi, rocm-smi, amd-smi on PATH on node1: no GPU samples\n"
    )
    assert not (tmp_path / "metrics").exists()


def test_watch_stops_when_a_pid_is_gone(tmp_path: Path) -> None:
    env = _env(tmp_path, [{"samples": [[50, 1, 1.0]]}])
    ranks = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc = _watch(sys.executable, env, tmp_path, "--pid", str(ranks.pid))
    _rows_once(tmp_path / "metrics" / "gpu-node1.csv", 2, proc)
    assert proc.poll() is None
    ranks.kill()
    ranks.wait()
    assert proc.wait(timeout=10) == 0


@pytest.mark.parametrize("busy, warns", [([0] * 6 + [97] * 4, True), ([97] * 9 + [0], False)])
def test_watch_warns_once_while_it_runs(tmp_path: Path, busy: list[int], warns: bool) -> None:
    idle = [[b, 100, 80.0 if b < 10 else 500.0] for b in busy]  # GPU 1 idle 60%, or busy
    env = _env(tmp_path, [{"samples": [[99, 100, 520.0]]}, {"samples": idle}])
    events = tmp_path / "events.jsonl"
    args = ["--warn", "--events", str(events), "--window", "1", "--warmup", "0"]
    proc = _watch(sys.executable, env, tmp_path, *args)
    _rows_once(tmp_path / "metrics" / "gpu-node1.csv", 2 * 60, proc)  # 3 s of samples
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=10)
    lines = err.splitlines()
    if not warns:
        assert (lines, events.exists()) == ([], False)
        return
    [line] = lines
    assert line.startswith("hpclaunch: warning: input-bound? over the last ")
    assert re.search(r"GPU 1 on node1 idle \d+% of the time", line)
    assert "--stage" in line and "num_workers" in line
    [event] = [json.loads(e) for e in events.read_text().splitlines()]
    assert (event["event"], event["node"], event["kind"]) == ("input_bound", "node1", SOME_IDLE)
    assert [g[:2] for g in event["gpus"]] == [["node1", 1]]
    assert event["message"] == line[len("hpclaunch: warning: ") :]


# ----------------------------------------------------------------------------- analysis
def _rows(pattern: dict[tuple[str, int], list[Any]], samples: int = 100) -> list[Row]:
    """Recorded samples: (node, gpu) -> its cycle of busy % (or (busy, power) pairs)."""
    rows = []
    for i in range(samples):
        for (node, gpu), cycle in pattern.items():
            value = cycle[i % len(cycle)]
            busy, power = value if isinstance(value, tuple) else (value, 400.0)
            rows.append(Row(1000.0 + 2 * i, node, gpu, busy, 1000.0, power))
    return rows


BUSY = [97, 95, 99, 100, 92, 98, 96, 3, 97, 99]  # a dip in ten (a checkpoint, an epoch end)
IDLE_60 = [0, 2, 97, 1, 0, 96, 5, 98, 0, 99]  # idle (busy < 10%) in 6 samples of 10


def test_one_gpu_idle_60_percent_is_named() -> None:
    pattern = {("node1", 0): BUSY, ("node1", 1): BUSY, ("node2", 0): BUSY, ("node2", 1): IDLE_60}
    verdict = analyze(_rows(pattern))
    assert verdict is not None
    assert (verdict.kind, verdict.gpus) == (SOME_IDLE, [("node2", 1, 0.6)])
    assert verdict.span_s == 198.0
    text = warning(verdict)
    assert "over the last 3 min" in text and "GPU 1 on node2 idle 60% of the time" in text
    assert "--stage" in text and "num_workers" in text


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_busy_jobs_never_warn(gpus: int) -> None:
    pattern = {("node1", g): BUSY[g % 3 :] + BUSY[: g % 3] for g in range(gpus)}
    assert analyze(_rows(pattern)) is None
    noisy = {("node1", g): [50, 60, 70, 100, 9, 80, 90, 55, 65, 75] for g in range(gpus)}
    assert analyze(_rows(noisy)) is None


def test_all_gpus_mostly_idle_warns() -> None:
    mostly_idle = [0, 1, 0, 2, 0, 0, 99, 0, 5, 0]  # idle 90%
    pattern = {("node1", 0): mostly_idle, ("node1", 1): mostly_idle, ("node2", 0): mostly_idle}
    verdict = analyze(_rows(pattern))
    assert verdict is not None and verdict.kind == ALL_IDLE
    assert [g[:2] for g in verdict.gpus] == [("node1", 0), ("node1", 1), ("node2", 0)]
    assert verdict.idle_share == 0.9
    assert "all 3 GPUs (node1 GPU 0,1; node2 GPU 0) idle 90% of the time" in warning(verdict)


@pytest.mark.parametrize(
    "idle_in_ten, warns",
    [(5, True), (4, False)],  # GPU_IDLE_SHARE = 0.5, both ways
)
def test_some_idle_threshold(idle_in_ten: int, warns: bool) -> None:
    cycle = [0] * idle_in_ten + [99] * (10 - idle_in_ten)
    verdict = analyze(_rows({("n", 0): BUSY, ("n", 1): BUSY, ("n", 2): cycle}))
    assert (verdict is not None) == warns


@pytest.mark.parametrize("idle_in_ten, warns", [(8, True), (7, False)])  # ALL_IDLE_SHARE = 0.8
def test_all_idle_threshold(idle_in_ten: int, warns: bool) -> None:
    cycle = [0] * idle_in_ten + [99] * (10 - idle_in_ten)
    verdict = analyze(_rows({("n", 0): cycle, ("n", 1): cycle}))
    assert (verdict is not None and verdict.kind == ALL_IDLE) == warns


def test_a_lone_gpu_idle_60_percent_or_too_few_samples_say_nothing() -> None:
    # One GPU has no others to be busy: "some idle" needs them; 60% < ALL_IDLE_SHARE.
    assert analyze(_rows({("n", 0): IDLE_60})) is None
    idle = {("n", 0): [0], ("n", 1): [0]}
    assert analyze(_rows(idle, gpu_watch.MIN_SAMPLES - 1)) is None
    assert analyze(_rows(idle, gpu_watch.MIN_SAMPLES)) is not None
    assert analyze([]) is None


def test_mi250x_odd_gcd_is_never_idle_from_power() -> None:
    # No busy % (a tool that gives none), power only on the even GCDs (rocm-smi's "N/A
    # (Secondary die)" parses to no reading; some versions print 0 W): the odd GCDs are
    # not judged, so the busy even GCDs make no warning.
    for secondary_power in (None, 0.0):
        pattern = {
            ("nid1", g): [(None, 500.0 if g % 2 == 0 else secondary_power)] for g in range(8)
        }
        assert analyze(_rows(pattern)) is None
    # An odd GPU that reports its own low power (not a secondary die) is judged from it.
    pattern = {("n", 0): [(None, 500.0)], ("n", 1): [(None, 480.0)], ("n", 2): [(None, 60.0)]}
    pattern[("n", 3)] = [(None, 510.0)]
    verdict = analyze(_rows(pattern))
    assert verdict is not None and verdict.gpus == [("n", 2, 1.0)]
    # A secondary die with a busy % is judged from it like any GPU.
    pattern = {("n", 0): [(97, 500.0)], ("n", 1): [(0, None)], ("n", 2): [(95, 490.0)]}
    pattern[("n", 3)] = [(99, None)]
    verdict = analyze(_rows(pattern))
    assert verdict is not None and verdict.gpus == [("n", 1, 1.0)]
