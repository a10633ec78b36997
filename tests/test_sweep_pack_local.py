"""`sweep --pack` on this machine: the node agent (node/pack_agent.py) run alone on a
hand-written pack.json (GPU slots, the rank contract of multi-rank points), and
`hpclaunch sweep --cluster local --pack` end to end (CPU slots, a queue refilled as points
end, retries, --point-time, every point a run of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from builders import local_env
from hpclaunch import node
from hpclaunch.sweeps import packplan

PROGRAM = str(Path(__file__).parent / "programs" / "pack_point.py")
HPCLAUNCH = str(Path(sys.executable).parent / "hpclaunch")
AGENT = str(node.path(node.PACK_AGENT))


def _events(folder: Path) -> list[dict[str, Any]]:
    path = folder / node.EVENTS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _pack_json(tmp_path: Path, points: int, slots: list[dict[str, Any]], **extra: Any) -> Path:
    """A pack.json as packplan.plan writes it, the program run without the bootstrap."""
    sweep, token = tmp_path / "sweep", "TOKENXYZ"
    pack_dir = sweep / packplan.PACK_DIR
    for name in (packplan.QUEUE, packplan.TAKEN, packplan.DONE):
        (pack_dir / name).mkdir(parents=True)
    for index in range(points):
        (pack_dir / packplan.QUEUE / str(index)).touch()
        (sweep / "points" / str(index)).mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    data = {
        "sweep_dir": str(sweep),
        "pack_dir": str(pack_dir),
        "token": token,
        "point_dir": str(sweep / "points" / token),
        "checkpoint_dir": str(sweep / "points" / token / "checkpoints"),
        "argv": [sys.executable, PROGRAM, str(out), "0.3"],
        "env": {"HPCLAUNCH_POINT": token},
        "cwd": str(tmp_path),
        "points": {str(i): [["HPCLAUNCH_PARAM_I", str(i)]] for i in range(points)},
        "slots": slots,
        "tasks_per_point": 1,
        "retries": 0,
        "point_time": None,
        "gpu_vars": ["CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"],
        "gpu_unset": ["HIP_VISIBLE_DEVICES"],
        "ask": None,
        **extra,
    }
    path = pack_dir / packplan.PACK_JSON
    path.write_text(json.dumps(data))
    return path


def _seen(out: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in out.glob("p*.json")}


def test_the_agent_gives_each_point_its_slots_gpus_and_its_own_world(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    slots = [{"node": 0, "slot": s, "gpus": [s], "cpus": [cores[s % len(cores)]]} for s in (0, 1)]
    slots.append({"node": 1, "slot": 0, "gpus": [0], "cpus": cores})  # another node's
    pack = _pack_json(tmp_path, 5, slots)
    env = {**os.environ, "SLURM_PROCID": "7", "SLURM_NTASKS": "9", "SLURM_JOB_ID": "4242"}
    env["HIP_VISIBLE_DEVICES"] = "0,1"
    done = subprocess.run([sys.executable, "-I", "-S", AGENT, str(pack), "0"], env=env,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0
    seen = _seen(tmp_path / "out")
    assert sorted(seen) == [f"p{i}-r0-t1" for i in range(5)]  # node 0 ran every point
    ports = set()
    for index in range(5):
        rec = seen[f"p{index}-r0-t1"]
        start = next(e for e in _events(tmp_path / "sweep" / "points" / str(index))
                     if e["event"] == "point_start")  # fmt: skip
        gpu = str(start["gpus"][0])
        assert rec["env"]["CUDA_VISIBLE_DEVICES"] == rec["env"]["ROCR_VISIBLE_DEVICES"] == gpu
        assert rec["cpus"] == start["cpus"]
        # the point's own world, not the agent's step (SLURM_PROCID=7 of 9 hidden)
        assert rec["env"]["RANK"] is None or rec["env"]["RANK"] == "0"
        assert (rec["env"]["SLURM_PROCID"], rec["env"]["SLURM_NTASKS"]) == ("0", "1")
        ports.add((start["slot"], rec["env"]["MASTER_PORT"]))
    assert len({port for _, port in ports}) == 2  # one MASTER_PORT per slot
    assert sorted(os.listdir(tmp_path / "sweep" / "pack" / "done")) == [str(i) for i in range(5)]


def test_a_multi_rank_point_gets_world_two_on_a_two_gpu_slot(tmp_path: Path) -> None:
    slots = [{"node": 0, "slot": 0, "gpus": [0, 1], "cpus": sorted(os.sched_getaffinity(0))}]
    pack = _pack_json(tmp_path, 2, slots, tasks_per_point=2)
    subprocess.run([sys.executable, "-I", "-S", AGENT, str(pack), "0"], timeout=60, check=True)
    seen = _seen(tmp_path / "out")
    for index in range(2):
        ranks = [seen[f"p{index}-r{r}-t1"]["env"] for r in (0, 1)]
        assert [(e["SLURM_PROCID"], e["SLURM_NTASKS"]) for e in ranks] == [("0", "2"), ("1", "2")]
        assert {e["CUDA_VISIBLE_DEVICES"] for e in ranks} == {"0,1"}
        assert len({e["MASTER_PORT"] for e in ranks}) == 1


def _hpclaunch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPCLAUNCH, *args], cwd=tmp_path, env=local_env(tmp_path), capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_local_pack_refills_its_slots_and_retries_and_ends_points(tmp_path: Path) -> None:
    configs = tmp_path / "points.txt"
    lines = ["0.1", "1.5", "0.1", "0.1 fail-once", "0.1 hang", "0.3", "0.1 fail"]
    configs.write_text("".join(f"{line}\n" for line in lines))
    out = tmp_path / "out"
    out.mkdir()
    proc = _hpclaunch(tmp_path, "sweep", "--pack", "--cpus-per-point", "1", "--retries", "1",
                      "--point-time", "00:00:04", "--configs", str(configs), "--",
                      sys.executable, PROGRAM, str(out))  # fmt: skip
    # the lowest failed point's code: point 4, ended by SIGTERM past --point-time
    assert proc.returncode == 143, proc.stdout + proc.stderr
    sweep_id = proc.stdout.split()[1]
    sweep_dir = tmp_path / "runs" / "default" / sweep_id
    status = _hpclaunch(tmp_path, "sweep", "status", sweep_id, "--json")
    rows = {p["index"]: p for p in json.loads(status.stdout)["points"]}
    assert [rows[i]["state"] for i in range(7)] == ["COMPLETED"] * 4 + ["FAILED"] + [
        "COMPLETED",
        "FAILED",
    ]
    # the failing point ran again in its slot, once; the hanging one was ended
    assert (out / "p3-r0-t2.json").exists()
    assert [e["event"] for e in _events(sweep_dir / "points" / "6")].count("point_retry") == 1
    end4 = [e for e in _events(sweep_dir / "points" / "4") if e["event"] == "point_end"][-1]
    assert end4["reason"] == "point-time" and end4["exit_code"] != 0
    # the slots: at most one point each at a time, never idle while points were queued
    by_slot: dict[int, list[tuple[float, float]]] = {}
    for index in range(7):
        events = _events(sweep_dir / "points" / str(index))
        start = next(e for e in events if e["event"] == "point_start")
        end = [e for e in events if e["event"] == "point_end"][-1]
        by_slot.setdefault(start["slot"], []).append((start["time"], end["time"]))
    assert sorted(by_slot) == [0, 1]
    for spans in by_slot.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert 0 <= start - end < 1.0  # the next point started when the last ended
    # each point a run of its own: its logs, its node-local folder (removed at its end;
    # the hanging point 4 never wrote what it saw)
    assert (sweep_dir / "points" / "1" / "logs" / "rank-0.out").exists()
    seen = [json.loads(p.read_text()) for p in out.glob("p*-r0-t1.json")]
    scratch = [s["env"]["HPCLAUNCH_LOCAL"] for s in seen]
    assert all(s["local_is_dir"] for s in seen) and len(set(scratch)) == len(seen) == 6
    assert not any(os.path.exists(path) for path in scratch)


def test_bad_pack_requests_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    for args, words in (
        (["--cpus-per-point", "100000"], "--cpus-per-point: 100000 is above a node's"),
        (["--pack-jobs", "4"], "--pack-jobs: 4 is above the points"),
        (["--gpus-per-point", "1"], "--gpus-per-point: 1 is more than a node's 0 GPUs"),
    ):
        proc = _hpclaunch(tmp_path, "sweep", "--pack", *args, "--grid", "x=1,2,3", "--",
                          sys.executable, PROGRAM, "out", "0")  # fmt: skip
        assert proc.returncode == 2
        assert proc.stderr.startswith(f"hpclaunch: error: {words}")
        assert proc.stderr.count("\n") == 1
        assert not (tmp_path / "runs").exists()


def test_the_dry_run_shows_the_slot_table_script_and_agent(tmp_path: Path) -> None:
    proc = _hpclaunch(tmp_path, "sweep", "--pack", "--cpus-per-point", "1", "--dry-run",
                      "--grid", "x=1,2,3", "--", sys.executable, PROGRAM, "out", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "# slots (node, slot, GPUs, cores):" in text
    assert "#   node 0  slot 0  gpus -  cores 0" in text
    assert "#SBATCH --no-kill" in text
    assert "srun --no-kill --kill-on-bad-exit=0 --nodes=1 --ntasks=1 --ntasks-per-node=1" in text
    assert f"python3 -I -S {tmp_path}/runs/default/" in text and "/pack/pack.json" in text
    assert not (tmp_path / "runs").exists()


def test_optuna_packed_asks_a_trial_when_a_slot_frees(tmp_path: Path) -> None:
    import optuna

    from hpclaunch.sweeps import trials

    space = tmp_path / "space.toml"
    space.write_text('x = {type = "float", low = 0.0, high = 4.0}\n', encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    point = str(Path(__file__).parent / "programs" / "sweep_point.py")
    proc = _hpclaunch(tmp_path, "sweep", "--pack", "--cpus-per-point", "1", "--optuna",
                      str(space), "--trials", "8", "--metric", "loss", "--",
                      sys.executable, point, str(out), "--sleep", "0.5", "--quadratic")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep_id = proc.stdout.split()[1]
    sweep_dir = tmp_path / "runs" / "default" / sweep_id
    study = optuna.load_study(study_name=sweep_id, storage=trials.storage(sweep_dir))
    done = study.get_trials(deepcopy=False)
    assert [t.state.name for t in done] == ["COMPLETE"] * 8
    spans = [(t.datetime_start, t.datetime_complete) for t in done]
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    level = most = 0
    for _, step in edges:
        level += step
        most = max(most, level)
    assert most <= 2  # never more trials RUNNING than slots


def test_cancel_of_a_packed_point_ends_it_and_its_slot_goes_on(tmp_path: Path) -> None:
    import time

    configs = tmp_path / "points.txt"
    configs.write_text("0.1\n0.1 hang\n0.5\n0.5\n0.5\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    argv = [HPCLAUNCH, "sweep", "--pack", "--cpus-per-point", "1", "--configs", str(configs),
            "--", sys.executable, PROGRAM, str(out)]  # fmt: skip
    started = time.time()
    sweep = subprocess.Popen(argv, cwd=tmp_path, env=local_env(tmp_path), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert sweep.stdout is not None
    sweep_id = sweep.stdout.readline().split()[1]
    point = tmp_path / "runs" / "default" / sweep_id / "points" / "1"
    while not any(e["event"] == "point_start" for e in _events(point)):
        assert time.time() - started < 60
        time.sleep(0.1)
    cancel = _hpclaunch(tmp_path, "cancel", f"{sweep_id}:1")
    assert cancel.returncode == 0, cancel.stderr
    rest, _ = sweep.communicate(timeout=120)
    assert time.time() - started < 60  # the hanging point did not run its hour
    assert "point 1: CANCELLED" in rest
    for index in (0, 2, 3, 4):
        assert f"point {index}: COMPLETED" in rest
    # the slot that ran point 1 went on with the queue
    slot = next(e["slot"] for e in _events(point) if e["event"] == "point_start")
    after = [
        e for i in (2, 3, 4)
        for e in _events(point.parent / str(i)) if e["event"] == "point_start"
    ]  # fmt: skip
    assert slot in {e["slot"] for e in after}


def test_a_slots_gpus_are_the_steps_devices_by_place() -> None:
    agent = _load_agent()
    assert agent.slot_devices("4,5,6,7", [1, 2]) == "5,6"
    assert agent.slot_devices("", [1]) == "1"
    assert agent.slot_devices("0", [1]) == "1"  # fewer listed than the slot names: as planned


def _load_agent() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("pack_agent_under_test", AGENT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_point_above_its_memory_bound_is_ended_with_that_reason(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    hog = "x = bytearray(300_000_000); import time; time.sleep(60)"
    slots = [{"node": 0, "slot": 0, "gpus": [], "cpus": cores}]
    pack = _pack_json(tmp_path, 1, slots, mem_per_point_mb=100)
    data = json.loads(pack.read_text())
    data["argv"] = [sys.executable, "-c", hog]
    pack.write_text(json.dumps(data))
    subprocess.run([sys.executable, "-I", "-S", AGENT, str(pack), "0"], timeout=60, check=True)
    [end] = [e for e in _events(tmp_path / "sweep" / "points" / "0") if e["event"] == "point_end"]
    assert end["reason"].startswith("memory: ") and "--mem-per-point 100 MB" in end["reason"]
    assert end["exit_code"] != 0


def test_run_pack_commands_runs_each_line_as_a_run_of_its_own(tmp_path: Path) -> None:
    commands = tmp_path / "commands.txt"
    commands.write_text(
        f"{sys.executable} -c 'import sys; print(sys.argv[1:])' 'a b' '$HOME'\necho one   two\n",
        encoding="utf-8",
    )
    proc = _hpclaunch(tmp_path, "run", "--pack", "--cpus-per-point", "1", "--commands",
                      str(commands))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep_dir = tmp_path / "runs" / "default" / proc.stdout.split()[1]
    logs = [(sweep_dir / "points" / str(i) / "logs" / "rank-0.out").read_text() for i in (0, 1)]
    assert logs == ["['a b', '$HOME']\n", "one two\n"]  # the configs file's quoting
    refused = _hpclaunch(tmp_path, "run", "--pack", "--", "echo", "x")
    assert refused.returncode == 2
    assert refused.stderr.startswith("hpclaunch: error: --commands: ")


def test_max_parallel_caps_the_points_running_across_the_slots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--pack", "--cpus-per-point", "1", "--max-parallel", "1", "--repeat", "4"]
    proc = _hpclaunch(tmp_path, "sweep", *argv, "--", sys.executable, PROGRAM, str(out), "0.3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep_dir = tmp_path / "runs" / "default" / proc.stdout.split()[1]
    spans = []
    for index in range(4):
        events = _events(sweep_dir / "points" / str(index))
        start = next(e["time"] for e in events if e["event"] == "point_start")
        spans.append((start, next(e["time"] for e in events if e["event"] == "point_end")))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # one at a time


def test_an_agent_ended_by_a_signal_ends_its_running_points(tmp_path: Path) -> None:
    import signal
    import time

    slots = [{"node": 0, "slot": 0, "gpus": [], "cpus": sorted(os.sched_getaffinity(0))}]
    pack = _pack_json(tmp_path, 1, slots)
    data = json.loads(pack.read_text())
    data["argv"] = [sys.executable, "-c", "import time; time.sleep(300)"]
    pack.write_text(json.dumps(data))
    agent = subprocess.Popen([sys.executable, "-I", "-S", AGENT, str(pack), "0"])
    folder = tmp_path / "sweep" / "points" / "0"
    deadline = time.time() + 30
    while not [e for e in _events(folder) if e["event"] == "point_start"]:
        assert time.time() < deadline
        time.sleep(0.1)
    [start] = [e for e in _events(folder) if e["event"] == "point_start"]
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.time() + 10
    while os.path.exists(f"/proc/{start['pid']}") and time.time() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{start['pid']}")  # the point went with its agent
