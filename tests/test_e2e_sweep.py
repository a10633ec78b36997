"""Sweeps on the testbed: real Slurm job arrays (sbatch --array, throttles, scancel,
scontrol update, squeue -r, sacct -c after slurmctld purged the jobs)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

import testbed
from builders import skip_without
from conftest import PROGRAMS, VENV_BIN, Hpc
from sweeptools import most_at_once

pytestmark = pytest.mark.testbed

POINT = str(PROGRAMS / "sweep_point.py")


def _sweep(hpc: Hpc, *args: str, timeout: float = 180, rc: int = 0) -> dict[str, Any]:
    proc = hpc.run("sweep", "--json", *args, timeout=timeout)
    assert proc.returncode == rc, proc.stderr
    return dict(json.loads(proc.stdout.splitlines()[0]))


def _status(hpc: Hpc, sweep_id: str, *extra: str) -> dict[str, Any]:
    proc = hpc.run("sweep", "status", sweep_id, "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _records(out: Path) -> dict[str, dict[str, Any]]:
    """p<POINT>-a<ATTEMPT>-r<RANK> -> what that rank wrote."""
    return {p.stem: json.loads(p.read_text()) for p in out.glob("p*-a*-r*.json")}


def _point_spans(sweep_dir: Path) -> list[tuple[float, float]]:
    """Each point's own start and end (the array script's events)."""
    spans = []
    for events in sorted(sweep_dir.glob("points/*/events.jsonl")):
        found = {}
        for line in events.read_text().splitlines():
            event = json.loads(line)
            if event["event"] in ("point_start", "point_end"):
                found[event["event"]] = float(event["time"])
        spans.append((found["point_start"], found["point_end"]))
    return spans


def test_grid_with_repeats_one_array_throttled(hpc: Hpc) -> None:
    out = hpc.folder("out")
    grid = ("--grid", "lr=0.1,0.01,0.001", "--grid", "opt=adam,sgd", "--repeat", "2")
    program = ("python3", POINT, str(out), "--sleep", "1", "--lr={lr}", "{opt}", "s{seed}")
    line = _sweep(hpc, *grid, "--max-parallel", "2", "--wait", "--", *program)
    assert len(line["job_ids"]) == 1  # one sbatch call, one array
    sweep_dir = Path(line["sweep_dir"])
    data = json.loads((sweep_dir / "sweep.json").read_text())
    assert [a["spec"] for a in data["arrays"]] == ["0-11%2"]
    found = _records(out)
    assert len(found) == 12
    seen = set()
    for point in range(12):
        rec = found[f"p{point}-a1-r0"]
        env = rec["env"]
        params = json.loads(env["HPCLAUNCH_PARAMS"])
        args = [bytes.fromhex(a).decode() for a in rec["argv"]]
        assert args == [f"--lr={params['lr']}", params["opt"], f"s{params['seed']}"]
        assert env["HPCLAUNCH_PARAM_LR"] == params["lr"]
        assert env["HPCLAUNCH_PARAM_SEED"] == str(params["seed"])
        assert env["HPCLAUNCH_POINT"] == str(point) and env["HPCLAUNCH_POINTS"] == "12"
        assert env["HPCLAUNCH_SWEEP_ID"] == line["sweep_id"]
        seen.add((params["lr"], params["opt"], params["seed"]))
    assert len(seen) == 12  # distinct and complete: 3 x 2 x 2
    assert most_at_once(_point_spans(sweep_dir)) <= 2
    status = _status(hpc, line["sweep_id"])
    assert [p["state"] for p in status["points"]] == ["COMPLETED"] * 12
    assert all(p["result"] and "end" in p["result"] for p in status["points"])

    # A second such sweep, held, throttled to 3 before it is released: 3 at once.
    out2 = hpc.folder("out2")
    held = _sweep(hpc, "--grid", "lr=0.1,0.01,0.001", "--grid", "opt=adam,sgd",
                  "--max-parallel", "2", "--sbatch-arg=--hold", "--",
                  "python3", POINT, str(out2), "--sleep", "4")  # fmt: skip
    proc = hpc.run("sweep", "throttle", held["sweep_id"], "3")
    assert proc.returncode == 0 and "at most 3" in proc.stdout, proc.stderr
    shown = hpc.cmd(["squeue", "-h", "-j", held["job_ids"][0], "-o", "%i"]).stdout
    assert "%3" in shown, shown
    assert hpc.cmd(["scontrol", "release", held["job_ids"][0]]).returncode == 0
    assert hpc.run("sweep", "wait", held["sweep_id"], timeout=240).returncode == 0
    assert most_at_once(_point_spans(Path(held["sweep_dir"]))) == 3


NASTY = [
    "--name 'two words' \"dq $HOME\" ;semi `echo tick` $(touch PWNED) ünï €",
    "# a comment line: no point",
    "",
    "   ",
    "plain 'it''s' a\\ b --x={{literal}}",
]


def test_configs_txt_words_reach_every_rank_unexecuted(hpc: Hpc) -> None:
    out = hpc.folder("out")
    configs = hpc.cwd / "experiment_configurations.txt"
    configs.write_text("\n".join(NASTY) + "\n", encoding="utf-8")
    line = _sweep(hpc, "-N", "2", "--configs", str(configs), "--wait", "--",
                  "python3", POINT, str(out))  # fmt: skip
    found = _records(out)
    assert sorted(found) == ["p0-a1-r0", "p0-a1-r1", "p1-a1-r0", "p1-a1-r1"]
    expected = [
        ["--name", "two words", "dq $HOME", ";semi", "`echo", "tick`", "$(touch", "PWNED)",
         "ünï", "€"],
        ["plain", "its", "a b", "--x={literal}"],
    ]  # fmt: skip
    for point, words in enumerate(expected):
        for rank in (0, 1):
            got = [bytes.fromhex(a).decode() for a in found[f"p{point}-a1-r{rank}"]["argv"]]
            assert got == words
    assert not list(hpc.cwd.rglob("PWNED")) and not list(Path("/").glob("PWNED"))
    assert len(json.loads((Path(line["sweep_dir"]) / "sweep.json").read_text())["points"]) == 2


def test_a_two_by_two_point_wires_up(hpc: Hpc) -> None:
    skip_without("torch")
    out = hpc.folder("out")
    _sweep(hpc, "-N", "2", "--tasks-per-node", "2", "--grid", "width=7", "--wait", "--",
           "python3", POINT, str(out), "--gloo", "--width", "{width}")  # fmt: skip
    found = _records(out)
    assert sorted(found) == [f"p0-a1-r{r}" for r in range(4)]
    for rec in found.values():
        assert rec["sum"] == 10.0  # 1 + 2 + 3 + 4: all four ranks joined one all-reduce
        assert rec["env"]["HPCLAUNCH_PARAM_WIDTH"] == "7"
        assert [bytes.fromhex(a).decode() for a in rec["argv"]] == ["--width", "7"]
    assert {rec["env"]["SLURMD_NODENAME"] for rec in found.values()} == {"node1", "node2"}


def test_optuna_eight_trials_and_a_failed_point_retried(hpc: Hpc) -> None:
    pytest.importorskip("optuna")
    out = hpc.folder("out")
    space = hpc.cwd / "space.toml"
    space.write_text('x = {type = "float", low = -5.0, high = 5.0}\n')
    line = _sweep(hpc, "--optuna", str(space), "--trials", "8", "--metric", "loss",
                  "--max-parallel", "2", "--wait", "--",
                  "python3", POINT, str(out), "--quadratic", "--fail-point", "3:1",
                  "--x={x}", rc=1)  # fmt: skip
    status = _status(hpc, line["sweep_id"], "--metric", "loss")
    states = [p["state"] for p in status["points"]]
    assert states == ["COMPLETED"] * 3 + ["FAILED"] + ["COMPLETED"] * 4
    import optuna

    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(Path(line["sweep_dir"]) / "optuna.journal"))
    )
    study = optuna.load_study(study_name=line["sweep_id"], storage=storage)
    trial_states = sorted(t.state.name for t in study.trials)
    assert trial_states == ["COMPLETE"] * 7 + ["FAIL"]
    best = status["best"]
    losses = [p["result"]["loss"] for p in status["points"] if p["state"] == "COMPLETED"]
    assert best is not None and best["result"]["loss"] == min(losses)
    assert abs(best["result"]["loss"] - study.best_value) < 1e-12
    for point in status["points"]:  # every point's x reached its argument
        if point["state"] == "COMPLETED":
            x = point["params"]["x"]
            assert point["result"]["loss"] == pytest.approx((x - 2.0) ** 2)

    retried = hpc.run("sweep", "retry", line["sweep_id"], "--failed")
    assert retried.returncode == 0, retried.stderr
    assert hpc.run("sweep", "wait", line["sweep_id"], timeout=240).returncode == 0
    status = _status(hpc, line["sweep_id"])
    assert [p["attempts"] for p in status["points"]] == [1, 1, 1, 2, 1, 1, 1, 1]
    study = optuna.load_study(study_name=line["sweep_id"], storage=storage)
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE"] * 8 + ["FAIL"]
    assert (Path(line["sweep_dir"]) / "points/3/attempts/1/logs").is_dir()


@pytest.mark.serial  # reconfigures slurmctld (MinJobAge)
def test_failed_and_cancelled_points_retried_and_right_after_purge(hpc: Hpc) -> None:
    out = hpc.folder("out")
    program = ("python3", POINT, str(out), "--fail-point", "1:3", "--sleep-if", "{k}")
    line = _sweep(hpc, "--grid", "k=0,1,2", "--", *program)
    sweep_id, sweep_dir = line["sweep_id"], Path(line["sweep_dir"])
    # Point 2 sleeps long on its first attempt: cancel it while it runs.
    deadline = time.monotonic() + 120
    while not (sweep_dir / "points/2/events.jsonl").exists():
        assert time.monotonic() < deadline, "point 2 never started"
        time.sleep(0.5)
    proc = hpc.run("sweep", "cancel", sweep_id, "--points", "2")
    assert proc.returncode == 0, proc.stderr
    waited = hpc.run("sweep", "wait", sweep_id, timeout=180)
    assert waited.returncode == 3, waited.stdout + waited.stderr
    status = _status(hpc, sweep_id)
    assert [p["state"] for p in status["points"]] == ["COMPLETED", "FAILED", "CANCELLED"]
    assert [p["exit_code"] for p in status["points"]] == [0, 3, 143]

    retried = hpc.run("sweep", "retry", sweep_id, "--failed")
    assert retried.returncode == 0, retried.stderr
    data = json.loads((sweep_dir / "sweep.json").read_text())
    assert data["arrays"][-1]["spec"] == "1-2"  # just those two, in one array
    assert hpc.run("sweep", "wait", sweep_id, timeout=180).returncode == 0
    status = _status(hpc, sweep_id)
    assert [p["state"] for p in status["points"]] == ["COMPLETED"] * 3
    assert [p["attempts"] for p in status["points"]] == [1, 2, 2]
    assert (sweep_dir / "points/1/attempts/1/logs/rank-0.exit").is_file()

    # A second sweep cancelled (one point running, one pending) and never looked at
    # before slurmctld forgets both: accounting (sacct -c here) answers.
    other = _sweep(hpc, "--grid", "k=2", "--repeat", "2", "--max-parallel", "1", "--",
                   "python3", POINT, str(hpc.folder("out2")), "--sleep-if", "{k}")  # fmt: skip
    other_dir = Path(other["sweep_dir"])
    while not (other_dir / "points/0/events.jsonl").exists():
        assert time.monotonic() < deadline + 120, "point 0 never started"
        time.sleep(0.5)
    assert hpc.cmd(["scancel", other["job_ids"][0]]).returncode == 0
    jobs = [*line["job_ids"], *(str(a["job_id"]) for a in data["arrays"]), other["job_ids"][0]]
    with testbed.min_job_age(2):
        deadline = time.monotonic() + 150
        while any(testbed.known_to_controller(j) for j in jobs):
            assert time.monotonic() < deadline, "slurmctld kept the jobs"
            time.sleep(2)
    assert [p["state"] for p in _status(hpc, sweep_id)["points"]] == ["COMPLETED"] * 3
    other_status = _status(hpc, other["sweep_id"])
    assert [p["state"] for p in other_status["points"]] == ["CANCELLED", "CANCELLED"]
    assert sorted(other_status["slurm_calls"]) == ["sacct", "squeue"]  # one each, no more
    again = _status(hpc, other["sweep_id"])
    assert again["slurm_calls"] == []  # what was learnt is kept: a finished sweep asks nothing
    assert os.path.isdir(other_dir)


def test_a_grid_above_max_array_size_is_split(hpc: Hpc) -> None:
    values = ",".join(str(i) for i in range(1003))  # MaxArraySize 1001: tasks 0-1000
    line = _sweep(hpc, "--grid", f"a={values}", "--max-parallel", "4", "--sbatch-arg=--hold",
                  "--", "true", "{a}")  # fmt: skip
    try:
        assert len(line["job_ids"]) == 2
        data = json.loads((Path(line["sweep_dir"]) / "sweep.json").read_text())
        assert [(a["offset"], a["spec"].split("%")[0]) for a in data["arrays"]] == [
            (0, "0-1000"),
            (1001, "0-1"),
        ]
        throttles = [int(a["spec"].split("%")[1]) for a in data["arrays"]]
        assert sum(throttles) == 4 and min(throttles) >= 1  # --max-parallel shared
        status = _status(hpc, line["sweep_id"])
        assert [p["index"] for p in status["points"]] == list(range(1003))
        assert {p["state"] for p in status["points"]} == {"PENDING"}
        # Point 1002's parameters: line 1003 of params.sh, which its task sources.
        table = (Path(line["sweep_dir"]) / "params.sh").read_text().splitlines()
        assert len(table) == 1003 and "HPCLAUNCH_PARAM_A=1002 " in table[1002]
    finally:
        hpc.cmd(["scancel", *line["job_ids"]])


def _bad_requests(folder: Path) -> list[tuple[list[str], str]]:
    """(arguments, a word the one error line must hold) for every refusal of the issue."""
    (folder / "empty.txt").write_text("# only comments\n\n   \n")
    (folder / "broken.txt").write_text("--ok 1\n--name 'unclosed\n")
    (folder / "space.toml").write_text('x = {type = "normal", low = 0, high = 1}\n')
    wide = ",".join(str(i) for i in range(101))
    prog = ["--", "true", "{a}"]
    return [
        (["--grid", "a=", *prog], "--grid"),
        (["--configs", str(folder / "empty.txt"), "--", "true"], "empty"),
        (["--grid", "1a=1,2", "--", "true"], "identifier"),
        (["--grid", "a=1", "--grid", "a=2", *prog], "twice"),
        (["--grid", "a=1", "--", "true", "{b}"], "{{b}}"),
        (["--configs", str(folder / "broken.txt"), "--", "true"], "broken.txt:2"),
        (["--optuna", str(folder / "space.toml"), "--trials", "2", "--metric", "m", "--",
          "true"], "space.toml"),
        (["--configs", str(folder / "missing.txt"), "--", "true"], "missing.txt"),
        (["--optuna", str(folder / "missing.toml"), "--trials", "2", "--metric", "m", "--",
          "true"], "missing.toml"),
        (["--grid", "a=1", "--repeat", "0", *prog], "--repeat"),
        (["--grid", "a=1", "--max-parallel", "0", *prog], "--max-parallel"),
        (["--optuna", str(folder / "space.toml"), "--trials", "0", "--metric", "m", "--",
          "true"], "--trials"),
        (["--grid", f"a={wide}", "--grid", f"b={wide}", *prog], "10201"),
        (["--grid", "rank=1,2", "--", "true"], "rank"),
        (["--grid", "lr=1", "--grid", "LR=2", "--", "true"], "case"),
        (["--grid", "seed=1,2", "--repeat", "2", "--", "true"], "seed"),
    ]  # fmt: skip


def test_bad_requests_are_one_line_and_leave_nothing(hpc: Hpc) -> None:
    for args, word in _bad_requests(hpc.cwd):
        proc = hpc.run("sweep", *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(lines) == 1 and lines[0].startswith("hpclaunch: error: "), (args, lines)
        assert word.lower() in lines[0].lower(), (word, lines[0])
        assert "Traceback" not in proc.stderr + proc.stdout
    assert testbed.jobs_from(hpc.cwd) == []  # this test's jobs: others run side by side
    assert not (hpc.cwd / "runs").exists()
    assert hpc.runs() == []


def test_points_in_a_container_with_staged_data_side_by_side(hpc: Hpc, user_image: Path) -> None:
    """Three points at once on the testbed's nodes, each staging its data into its own
    node-local folder (a point's staging guard must not take a running sibling's folder
    for a dead job's) and running in the image."""
    data = hpc.folder("data")
    (data / "a.txt").write_text("hello\n")
    out = hpc.folder("out")
    program = hpc.cwd / "sweep_point.py"  # the image sees the project folder, not tests/
    program.write_text(Path(POINT).read_text())
    line = _sweep(
        hpc,
        "--grid",
        "k=0,1,2",
        "--max-parallel",
        "3",
        "--stage",
        str(data),
        "--container",
        str(user_image),
        "--container-runtime",
        "charliecloud",
        "--wait",
        "--",
        "python3",
        str(program),
        str(out),
        "--sleep",
        "2",
        "{k}",
    )
    found = _records(out)
    assert sorted(found) == ["p0-a1-r0", "p1-a1-r0", "p2-a1-r0"]
    for point in range(3):
        rec = found[f"p{point}-a1-r0"]
        assert [bytes.fromhex(a).decode() for a in rec["argv"]] == [str(point)]
    assert most_at_once(_point_spans(Path(line["sweep_dir"]))) >= 2


def test_max_job_count_checked_by_a_counter_only_for_large_sweeps(hpc: Hpc) -> None:
    """The testbed's MaxJobCount is 10000: 6000 points ask sdiag (as hpcuser: it answers),
    10000 never fit; neither lists every user's jobs (tests/test_sweep_arrays.py counts
    the calls)."""
    large = hpc.run("sweep", "--dry-run", "--json", "--repeat", "6000", "--", "true", timeout=240)
    assert large.returncode == 0, large.stderr
    assert "cannot tell" not in large.stderr  # sdiag answered
    never = hpc.run("sweep", "--dry-run", "--repeat", "10000", "--", "true", timeout=240)
    assert never.returncode == 2
    assert "do not fit the cluster's job table (MaxJobCount 10000)" in never.stderr


_COUNTED_REFRESH = """
import json, sys
from pathlib import Path
from hpclaunch.records import runrecord
from hpclaunch.slurm import commands
from hpclaunch.backends import runstatus
ran = []
for name in ("run", "query"):
    def counted(argv, *args, _real=getattr(commands, name), **kwargs):
        ran.append(argv[0])
        return _real(argv, *args, **kwargs)
    setattr(commands, name, counted)
found = runstatus.refresh([runrecord.load(Path(p)) for p in sys.argv[1:]])
print(json.dumps({"calls": ran, "found": [[r.state, r.exit_code] for r in found]}))
"""


def _stale(run_dir: Path) -> None:
    """A record as a process that never looked again left it: PENDING (root rewrites it
    in place, so the test user keeps owning it)."""
    path = run_dir / "run.json"
    data = json.loads(path.read_text())
    data.update(state="PENDING", exit_code=None)
    path.write_text(json.dumps(data))


def test_one_refresh_serves_runs_and_points_alike(hpc: Hpc) -> None:
    """Plain runs and sweep points that ended while nobody looked: one squeue -r and one
    sacct (the mode the points' records name) bring them all up to date."""
    plain = []
    for _ in range(2):
        proc = hpc.run("run", "--json", "--wait", "--", "true")
        assert proc.returncode == 0, proc.stderr
        plain.append(Path(json.loads(proc.stdout.splitlines()[0])["run_dir"]))
    program = ("python3", POINT, str(hpc.folder("out")), "--fail-point", "1:3")
    line = _sweep(hpc, "--grid", "k=0,1,2", "--wait", "--", *program, rc=3)
    points = [Path(line["sweep_dir"]) / "points" / str(i) for i in range(3)]
    for folder in [*plain, *points]:
        _stale(folder)
    proc = hpc.cmd([str(VENV_BIN / "python"), "-c", _COUNTED_REFRESH, *map(str, [*plain, *points])])
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert sorted(answer["calls"]) == ["sacct", "squeue"], answer  # one each, nothing more
    assert answer["found"] == [["COMPLETED", 0]] * 2 + [
        ["COMPLETED", 0],
        ["FAILED", 3],
        ["COMPLETED", 0],
    ]


def test_a_held_grid_point_is_its_record_until_its_task_makes_the_rest(hpc: Hpc) -> None:
    """Issue 26 (Performance: a held 1,000-point sweep to its id): the host writes
    nothing per grid point, not even its folder (the sweep's point.sh and params.sh serve
    every point, and its run record is made from sweep.json until it first changes); the
    array task makes its folder, job.sh, logs/ and checkpoints/, private, when it starts.
    Pending points' logs and status cope with them not there yet."""
    out = hpc.folder("out")
    line = _sweep(hpc, "--grid", "lr=0.5,x y", "--sbatch-arg=--hold", "--",
                  "python3", POINT, str(out), "--lr={lr}")  # fmt: skip
    sweep_dir, sweep_id = Path(line["sweep_dir"]), line["sweep_id"]
    try:
        for index in (0, 1):
            assert not (sweep_dir / "points" / str(index)).exists()  # nothing, not even []
            shown = json.loads(hpc.run("show", f"{sweep_id}:{index}", "--json").stdout)["record"]
            assert shown["run_id"] == f"{sweep_id}:{index}", shown
            assert shown["run_dir"] == str(sweep_dir / "points" / str(index))
            assert shown["job_id"] == f"{line['job_ids'][0]}_{index}", shown
        status = _status(hpc, sweep_id)
        assert [p["state"] for p in status["points"]] == ["PENDING"] * 2
        for command in ("logs", "show", "status"):
            done = hpc.run(command, f"{sweep_id}:1")
            assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert hpc.cmd(["scontrol", "release", line["job_ids"][0]]).returncode == 0
        assert hpc.run("sweep", "wait", sweep_id, timeout=240).returncode == 0
    finally:
        hpc.cmd(["scancel", *line["job_ids"]])
    found = {k.split("-a")[0]: v for k, v in _records(out).items() if k.endswith("-r0")}
    assert sorted(found) == ["p0", "p1"]
    for index, lr in ((0, "0.5"), (1, "x y")):
        env = found[f"p{index}"]["env"]
        assert env["HPCLAUNCH_PARAM_LR"] == lr and json.loads(env["HPCLAUNCH_PARAMS"]) == {"lr": lr}
        assert env["HPCLAUNCH_POINT"] == str(index) and env["HPCLAUNCH_POINTS"] == "2"
        assert env["HPCLAUNCH_SWEEP_ID"] == sweep_id
        assert [bytes.fromhex(a).decode() for a in found[f"p{index}"]["argv"]] == [f"--lr={lr}"]
        point = sweep_dir / "points" / str(index)
        for name in ("", "logs", "checkpoints"):
            assert (point / name).is_dir() and (point / name).stat().st_mode & 0o777 == 0o700
        assert (point / "job.sh").stat().st_mode & 0o777 == 0o600
        assert f"HPCLAUNCH_RUN_ID={sweep_id}:{index}\n" in (point / "job.sh").read_text()
        assert not [p for p in os.listdir(point) if p.startswith(".job.sh")]
        assert (point / "logs" / "batch.out").is_file()


def test_a_dry_run_shows_point_zeros_job_sh_and_its_params_line_as_its_task_gets_them(
    hpc: Hpc,
) -> None:
    """--dry-run prints what the task will run: point.sh numbered (no exports in it) and
    point 0's line of params.sh, sourced before it."""
    done = hpc.run("sweep", "--dry-run", "--grid", "lr=0.5,x y", "--", "true", "{lr}")
    assert done.returncode == 0, done.stderr
    job_sh = done.stdout.split("# each point's job.sh (point 0 shown):")[1]
    assert "export HPCLAUNCH_PARAM_LR" not in job_sh
    assert "\n# export HPCLAUNCH_SWEEP_ID=" in job_sh and " HPCLAUNCH_PARAM_LR=0.5 " in job_sh
