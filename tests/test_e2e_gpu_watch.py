"""The GPU watch on the testbed, with the nvidia-smi and rocm-smi stand-ins
(tests/doubles/gpu) put on the nodes' PATH through --setup: a 2-node job gets
metrics/gpu-<node>.csv for both nodes with the scripted values, a GPU idle 60% of the
time is named in the job's output and in `status`, busy GPUs are not; an MI250X's
secondary die (no power of its own) is never called idle; without a GPU tool the job
says so in one line and runs as before.

What it cannot show: real GPUs and the real tools (their timing, a real rocm-smi call's
second), ConstrainDevices (the testbed's fake GPUs are /dev/null-like devices and its
cgroup does not constrain them), and a watch on LUMI's nodes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, Hpc

pytestmark = pytest.mark.testbed

DOUBLES = REPO / "tests" / "doubles" / "gpu"
BUSY = [[95, 40000, 600.0]]
IDLE_60 = [[0, 2000, 90.0]] * 6 + [[97, 40000, 610.0]] * 4  # idle 6 samples in 10
SECONDS = 12  # the program's run: the watch samples every 0.5 s beside it
# A verdict over the last 5 s from the first sample on (the default: 60 s + 120 s).
WATCH_ENV = ("--env", "HPCLAUNCH_WATCH_WINDOW=5", "--env", "HPCLAUNCH_WATCH_WARMUP=0.001")


def _pattern(hpc: Hpc, name: str, data: dict[str, Any]) -> Path:
    path = hpc.cwd / name
    path.write_text(json.dumps(data))
    return path


def _submit(hpc: Hpc, *options: str) -> dict[str, Any]:
    proc = hpc.run(
        "run", "-N", "2", "--tasks-per-node", "1", "--gpus-per-node", "1", "--json",
        "--watch-interval", "0.5", *options,
        "--", "python3", "-c", f"import time; time.sleep({SECONDS}); print('trained')",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    started: dict[str, Any] = json.loads(proc.stdout)
    return started


def _finished(hpc: Hpc, started: dict[str, Any], timeout: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    # Returns when the run ends (one process asking Slurm, not a status command a poll).
    hpc.run("logs", started["run_id"], "--follow", timeout=timeout)
    while time.monotonic() < deadline:
        proc = hpc.run("status", started["run_id"], "--json")
        record: dict[str, Any] = json.loads(proc.stdout)
        if record["state"] not in ("CREATED", "PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return record
        time.sleep(2)
    pytest.fail(f"run {started['run_id']} did not end within {timeout} s")


def _rows(run_dir: Path, node: str) -> list[list[str]]:
    csv = run_dir / "metrics" / f"gpu-{node}.csv"
    assert csv.exists(), (run_dir / "logs" / "batch.out").read_text()
    lines = csv.read_text().splitlines()
    assert lines[0] == "time,node,gpu,busy_pct,mem_mib,power_w", lines[:2]
    return [line.split(",") for line in lines[1:]]


def test_two_nodes_sampled_and_the_idle_gpu_named(hpc: Hpc) -> None:
    path_setup = ("--setup", f"export PATH={DOUBLES}:$PATH")
    node1 = [{"samples": BUSY}, {"samples": IDLE_60}]  # GPU 1 idle 60% of the time
    scripted = {"gpus": node1, "nodes": {"node2": [{"samples": BUSY}] * 2}}
    nvidia = _pattern(hpc, "nvidia.json", scripted)
    # rocm-smi: no busy % at all, an MI250X pair (power on the even GCD only), a call a
    # sample.
    mi250x = [{"samples": [[None, 30000, 480.0]]}, {"samples": [[None, 30000, None]],
                                                    "secondary": True}]  # fmt: skip
    rocm = _pattern(hpc, "rocm.json", {"gpus": mi250x})
    watched = _submit(hpc, *path_setup, *WATCH_ENV, "--env", f"HPCLAUNCH_FAKE_GPU_PATTERN={nvidia}")
    rocm_bin = hpc.cwd / "rocm-bin"  # rocm-smi alone (nvidia-smi would be found first)
    rocm_bin.mkdir()
    (rocm_bin / "rocm-smi").symlink_to(DOUBLES / "rocm-smi")
    amd = _submit(
        hpc, "--setup", f"export PATH={rocm_bin}:$PATH", *WATCH_ENV,
        "--env", f"HPCLAUNCH_FAKE_GPU_PATTERN={rocm}",
    )  # fmt: skip
    plain = _submit(hpc)  # no GPU tool on the nodes' PATH

    _top_while_running(hpc, watched)
    record = _finished(hpc, watched)
    assert record["state"] == "COMPLETED" and record["exit_code"] == 0, record
    run_dir = Path(record["run_dir"])
    node1, node2 = _rows(run_dir, "node1"), _rows(run_dir, "node2")
    assert len(node1) >= 2 * 10 and len(node2) >= 2 * 10, (len(node1), len(node2))
    assert {tuple(r[1:]) for r in node2} == {("node2", g, "95", "40000", "600") for g in "01"}
    assert {tuple(r[1:]) for r in node1 if r[2] == "0"} == {("node1", "0", "95", "40000", "600")}
    idle = [tuple(r[3:]) for r in node1 if r[2] == "1"]
    assert set(idle) == {("0", "2000", "90"), ("97", "40000", "610")}, idle
    warning = "GPU 1 on node1 idle"
    assert any(warning in w for w in record.get("warnings", [])), record
    assert all("node2" not in w for w in record["warnings"]), record["warnings"]
    batch = (run_dir / "logs" / "batch.out").read_text()
    assert batch.count("hpclaunch: warning: input-bound?") == 1, batch
    assert warning in batch and "--stage" in batch and "num_workers" in batch, batch
    assert "srun:" not in batch and "slurmstepd" not in batch, batch  # a clean stop
    status = hpc.run("status", watched["run_id"]).stdout
    _top_and_plot(hpc, watched["run_id"], run_dir)
    assert any(line.startswith("warning") and warning in line for line in status.splitlines())
    assert not list(run_dir.glob(".gpu-watch-stop-*")), "the stop file is left"

    record = _finished(hpc, amd)
    assert record["state"] == "COMPLETED" and "warnings" not in record, record
    rows = _rows(Path(record["run_dir"]), "node1")
    assert {tuple(r[2:]) for r in rows} == {("0", "", "30000", "480"), ("1", "", "30000", "")}

    record = _finished(hpc, plain)
    assert record["state"] == "COMPLETED" and record["exit_code"] == 0, record
    run_dir = Path(record["run_dir"])
    assert not (run_dir / "metrics").exists()
    batch = (run_dir / "logs" / "batch.out").read_text()
    said = [line for line in batch.splitlines() if "gpu watch" in line]
    assert said == ["hpclaunch: gpu watch: no nvidia-smi, rocm-smi, amd-smi on PATH on "
                    "node1: no GPU samples"], batch  # fmt: skip
    assert "trained" in (run_dir / "logs" / "rank-0.out").read_text()


def _top_while_running(hpc: Hpc, started: dict[str, Any]) -> None:
    """`top --once` on the running job: the latest samples of every node's GPUs."""
    metrics = Path(started["run_dir"]) / "metrics"
    deadline = time.monotonic() + 120
    while len(list(metrics.glob("gpu-*.csv"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1)  # a few samples
    top = hpc.run("top", started["run_id"], "--once")
    assert top.returncode == 0, top.stdout + top.stderr
    assert "RUNNING" in top.stdout and "latest sample" in top.stdout, top.stdout
    gpus = [line.split()[:3] for line in top.stdout.splitlines() if line.startswith("node")]
    assert ["node2", "0", "95"] in gpus and ["node2", "1", "95"] in gpus, top.stdout


def _top_and_plot(hpc: Hpc, run_id: str, run_dir: Path) -> None:
    """The finished run's view, and its samples plotted (exactly the recorded values)."""
    top = hpc.run("top", run_id)
    assert top.returncode == 0, top.stdout + top.stderr
    lines = top.stdout.splitlines()
    assert lines[0].startswith(f"run {run_id} (job ") and "COMPLETED" in lines[0], lines
    gpus = [line.split()[:2] for line in lines if line.startswith("node")]
    assert gpus == [["node1", "0"], ["node1", "1"], ["node2", "0"], ["node2", "1"]], lines
    assert "GPU 1 on node1 idle" in top.stdout and "<- idle" in top.stdout, top.stdout
    data, png = hpc.cwd / "gpu.csv", hpc.cwd / "gpu.png"
    plot = hpc.run("plot", run_id, "--data", str(data), "-o", str(png))
    assert plot.returncode == 0 and png.stat().st_size > 0, plot.stdout + plot.stderr
    recorded = [
        line
        for node in ("node1", "node2")
        for line in (run_dir / "metrics" / f"gpu-{node}.csv").read_text().splitlines()[1:]
    ]
    assert data.read_text().splitlines()[1:] == recorded


def test_no_watch_and_jobs_without_gpus_have_none(hpc: Hpc) -> None:
    for options in (("--gpus-per-node", "1", "--no-watch"), ()):
        proc = hpc.run("run", "--dry-run", "-N", "2", *options, "--", "python3", "-c", "pass")
        assert proc.returncode == 0, proc.stderr
        assert "gpu_watch.py" not in proc.stdout and "HPCLAUNCH_WATCH" not in proc.stdout
    proc = hpc.run("run", "--dry-run", "--gpus-per-node", "1", "--", "python3", "-c", "pass")
    assert "--overlap" in proc.stdout and "gpu_watch.py" in proc.stdout, proc.stdout
    for bad in ("0.1", "601", "fast"):
        proc = hpc.run("run", "--gpus-per-node", "1", "--watch-interval", bad, "--", "true")
        assert proc.returncode == 2 and "--watch-interval" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("seconds", ["0", "1.2"])
def test_ranks_that_end_before_the_watch_started_leave_no_trace(hpc: Hpc, seconds: str) -> None:
    """The watch starts a second after the ranks: ranks done before that (0 s), or while
    its srun is still starting (1.2 s), stop it cleanly through the stop file."""
    pattern = _pattern(hpc, "busy.json", {"gpus": [{"samples": BUSY}]})
    proc = hpc.run(
        "run", "-N", "2", "--gpus-per-node", "1", "--wait",
        "--setup", f"export PATH={DOUBLES}:$PATH",
        "--env", f"HPCLAUNCH_FAKE_GPU_PATTERN={pattern}",
        "--", "python3", "-c", f"import time; time.sleep({seconds})",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [run_dir] = (hpc.cwd / "runs" / "default").iterdir()
    batch = (run_dir / "logs" / "batch.out").read_text()
    assert "srun:" not in batch and "slurmstepd" not in batch and "Terminated" not in batch
    assert not list(run_dir.glob(".gpu-watch-stop-*")), list(run_dir.iterdir())


def test_each_sweep_point_has_its_own_samples(hpc: Hpc) -> None:
    pattern = _pattern(hpc, "busy.json", {"gpus": [{"samples": BUSY}]})
    proc = hpc.run(
        "sweep", "--grid", "lr=1,2", "--gpus-per-node", "1", "--watch-interval", "0.5",
        "--setup", f"export PATH={DOUBLES}:$PATH",
        "--env", f"HPCLAUNCH_FAKE_GPU_PATTERN={pattern}", "--wait",
        "--", "python3", "-c", "import time; time.sleep(3)",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [sweep] = (hpc.cwd / "runs" / "default").iterdir()
    points = sorted((sweep / "points").iterdir())
    assert len(points) == 2, list(sweep.iterdir())
    for point in points:
        # Each point ran on one node, whichever Slurm chose (beside other tests' jobs it
        # need not be node1): its own samples are that node's file.
        [csv] = (point / "metrics").glob("gpu-node*.csv")
        rows = _rows(point, csv.stem.removeprefix("gpu-"))
        assert rows and {tuple(r[2:]) for r in rows} == {("0", "95", "40000", "600")}, rows


def test_a_step_of_an_allocation_is_watched_too(hpc: Hpc) -> None:
    """Inside salloc the run is a step: hpclaunch itself starts the watch's step beside it
    (and runs the --setup lines, which put the stand-in on PATH)."""
    pattern = _pattern(hpc, "busy.json", {"gpus": [{"samples": BUSY}]})
    argv = [
        "salloc", "-N", "2", "--gpus-per-node", "1",
        "hpclaunch", "run", "-N", "2", "--gpus-per-node", "1", "--watch-interval", "0.5",
        "--setup", f"export PATH={DOUBLES}:$PATH", "--wait", "--json",
        "--env", f"HPCLAUNCH_FAKE_GPU_PATTERN={pattern}",
        "--", "python3", "-c", "import time; time.sleep(4)",
    ]  # fmt: skip
    proc = hpc.cmd(argv, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [run_dir] = (hpc.cwd / "runs" / "default").iterdir()
    for node in ("node1", "node2"):
        rows = _rows(run_dir, node)
        assert len(rows) >= 3 and {tuple(r[2:]) for r in rows} == {("0", "95", "40000", "600")}
    assert "srun:" not in proc.stderr, proc.stderr
