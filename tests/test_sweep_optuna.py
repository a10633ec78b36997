"""`sweep --optuna`: the SPACE_FILE (every refusal one line) and ask/tell on a real Optuna
journal in a temp folder, sequential and from two processes at once (no Slurm)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hpclaunch.errors import UserError
from hpclaunch.sweeps import trials
from hpclaunch.sweeps.space import SpaceParam, read_space, require_optuna, to_distributions
from hpclaunch.sweeps.trials import ask, create_study, fail_stale, tell
from sweeptools import trial_rows

STUDY = "sw1"
X = (SpaceParam("x", "float", low=-5.0, high=5.0),)


# --- the SPACE_FILE ---------------------------------------------------------------------


def _refused(tmp_path: Path, text: str, name: str = "space.toml") -> UserError:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as info:
        read_space(path)
    err = info.value
    assert err.field == "--optuna"
    assert "\n" not in err.line()
    assert str(path) in err.problem
    return err


@pytest.mark.parametrize(
    ("text", "param", "words"),
    [
        ('x = {type = "bool"}', "x", "unknown type 'bool'"),
        ("x = {low = 1.0, high = 2.0}", "x", "no type"),
        ('x = {type = "float", high = 1.0}', "x", "missing low"),
        ('x = {type = "float", low = 1.0}', "x", "missing high"),
        ('x = {type = "float", low = 5.0, high = -5.0}', "x", "x: low 5.0 is above high -5.0"),
        ('x = {type = "float", low = 0.0, high = 1.0, log = true}', "x", "log needs low above 0"),
        (
            'x = {type = "float", low = 1.0, high = 9.0, log = true, step = 1.0}',
            "x",
            "log and step",
        ),
        ('x = {type = "float", low = 1.0, high = 9.0, log = "yes"}', "x", "not true or false"),
        ('x = {type = "float", low = 0.0, high = 1.0, step = 0.0}', "x", "step 0.0 is not above 0"),
        ('x = {type = "float", low = "a", high = 1.0}', "x", "low 'a' is not a number"),
        ('x = {type = "float", low = true, high = 1.0}', "x", "low True is not a number"),
        ('x = {type = "float", low = 0.0, high = inf}', "x", "high inf is not finite"),
        ('n = {type = "int", low = 1.5, high = 4}', "n", "low 1.5 is not an integer"),
        ('n = {type = "int", low = 1, high = 4, step = 0.5}', "n", "step 0.5 is not an integer"),
        ('opt = {type = "categorical", choices = []}', "opt", "choices is empty"),
        ('opt = {type = "categorical"}', "opt", "missing choices"),
        ('opt = {type = "categorical", choices = "adam"}', "opt", "must be a list"),
        ('opt = {type = "categorical", choices = [[1]]}', "opt", "choice [1] is not"),
        ('opt = {type = "categorical", choices = ["a", "a"]}', "opt", "'a' appears twice"),
        ('x = {type = "float", low = 0.0, high = 1.0, lo = 3}', "x", "unknown key lo"),
        ('o = {type = "categorical", choices = [1], low = 0}', "o", "unknown key low"),
        ('"a-b" = {type = "int", low = 1, high = 2}', "'a-b'", "must be an identifier"),
        ('"1x" = {type = "int", low = 1, high = 2}', "'1x'", "must be an identifier"),
        ('rank = {type = "int", low = 1, high = 2}', "rank", "placeholder {rank}"),
        ('master_port = {type = "int", low = 1, high = 2}', "master_port", "placeholder"),
        (
            'lr = {type = "int", low = 1, high = 2}\nLR = {type = "int", low = 1, high = 2}',
            "LR",
            "differs from lr only by case",
        ),
        ("x = 3", "x", "must be a table"),
    ],
)
def test_space_refusals(tmp_path: Path, text: str, param: str, words: str) -> None:
    err = _refused(tmp_path, text)
    assert f"space.toml: {param}: " in err.problem
    assert words in err.problem


def test_unknown_key_lists_the_allowed_ones(tmp_path: Path) -> None:
    err = _refused(tmp_path, 'x = {type = "float", low = 0.0, high = 1.0, lo = 3}')
    assert err.limit == "float takes type, low, high, log, step"


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("space.toml", "", "holds no parameters"),
        ("space.yaml", "# nothing yet\n", "holds no parameters"),
        ("space.yml", "{}\n", "holds no parameters"),
        ("space.toml", "x = 1\ny = = 3\n", "not valid TOML: Invalid value (at line 2"),
        ("space.yaml", "x: {type: int, low: 1\ny: 2\n", "not valid YAML at line 2"),
        ("space.yaml", "- x\n- y\n", "must map parameter names to tables, not a list"),
        ("space.json", "{}", "suffix '.json' is not known"),
    ],
)
def test_space_file_refusals(tmp_path: Path, name: str, text: str, words: str) -> None:
    assert words in _refused(tmp_path, text, name).problem


def test_missing_space_file(tmp_path: Path) -> None:
    for name in ("gone.toml", "gone.yaml"):
        with pytest.raises(UserError) as info:
            read_space(tmp_path / name)
        assert info.value.field == "--optuna"
        assert f"cannot read {tmp_path / name}" in info.value.problem


def test_yaml_without_pyyaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)
    path = tmp_path / "space.yaml"
    path.write_text("x: {type: float, low: 0.0, high: 1.0}\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        read_space(path)
    assert info.value.fix == "pip install 'hpclaunch[yaml]'"


def test_require_optuna_without_optuna(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(UserError) as info:
        require_optuna()
    assert info.value.line() == (
        "hpclaunch: error: --optuna: Optuna is not installed here. pip install 'hpclaunch[optuna]'"
    )


def test_space_parses_without_optuna(tmp_path: Path) -> None:
    path = tmp_path / "space.toml"
    path.write_text('x = {type = "float", low = 0.0, high = 1.0}\n', encoding="utf-8")
    code = (
        "import sys; sys.modules['optuna'] = None\n"
        "import hpclaunch.sweeps.trials\n"
        "from hpclaunch.sweeps.space import read_space\n"
        f"print(read_space(__import__('pathlib').Path({str(path)!r}))[0].name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "x"


TOML_SPACE = """
lr = {type = "float", low = 1e-5, high = 1e-1, log = true}
dropout = {type = "float", low = 0.0, high = 0.5, step = 0.1}
layers = {type = "int", low = 1, high = 4}
width = {type = "int", low = 64.0, high = 512, step = 64}
opt = {type = "categorical", choices = ["adam", "sgd"]}
mixed = {type = "categorical", choices = [1, 2.5, true, "x"]}
"""

YAML_SPACE = """
lr: {type: float, low: 1e-5, high: 1.0e-1, log: true}   # PyYAML reads 1e-5 as text
dropout: {type: float, low: 0.0, high: 0.5, step: 0.1}
layers:
  type: int
  low: 1
  high: 4
width: {type: int, low: 64, high: 512, step: 64}
opt: {type: categorical, choices: [adam, sgd]}
mixed: {type: categorical, choices: [1, 2.5, true, x]}
"""


def test_toml_and_yaml_give_the_same_distributions(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(TOML_SPACE, encoding="utf-8")
    (tmp_path / "s.yml").write_text(YAML_SPACE, encoding="utf-8")
    from_toml = read_space(tmp_path / "s.toml")
    assert from_toml == read_space(tmp_path / "s.yml")
    assert [p.name for p in from_toml] == ["lr", "dropout", "layers", "width", "opt", "mixed"]
    width = from_toml[3]
    assert (width.low, width.high, width.step) == (64, 512, 64)
    assert isinstance(width.low, int)
    dists = to_distributions(from_toml)
    assert dists == to_distributions(read_space(tmp_path / "s.yml"))
    import optuna.distributions as d

    assert dists["lr"] == d.FloatDistribution(1e-5, 1e-1, log=True)
    assert dists["dropout"] == d.FloatDistribution(0.0, 0.5, step=0.1)
    assert dists["width"] == d.IntDistribution(64, 512, step=64)
    assert dists["opt"] == d.CategoricalDistribution(["adam", "sgd"])


def test_low_equal_high_is_allowed(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('x = {type = "float", low = 1.0, high = 1.0}\n', encoding="utf-8")
    assert to_distributions(read_space(path))["x"].single()


# --- ask / tell on the journal ----------------------------------------------------------


class Alive:
    """The caller's squeue answer: records each call, returns the points it was told."""

    def __init__(self, living: Sequence[int] = ()) -> None:
        self.living = set(living)
        self.calls: list[list[int]] = []

    def __call__(self, points: Sequence[int]) -> set[int]:
        self.calls.append(list(points))
        return self.living & set(points)


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    create_study(tmp_path, STUDY, "minimize")
    return tmp_path


def _states(sweep_dir: Path) -> dict[int, str]:
    return {int(str(r["number"])): str(r["state"]) for r in trial_rows(sweep_dir, STUDY)}


def _attrs(sweep_dir: Path, number: int) -> dict[str, Any]:
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=trials.storage(sweep_dir))
    return study.trials[number].user_attrs


def test_ask_tell_loop(sweep: Path, capfd: pytest.CaptureFixture[str]) -> None:
    alive = Alive()
    for point in range(8):
        number, params = ask(sweep, STUDY, X, point, f"123_{point}", alive)
        assert number == point
        loss = (float(str(params["x"])) - 2) ** 2
        code = 1 if point == 3 else 0
        told = tell(sweep, STUDY, point, code, {"loss": loss} if code == 0 else None, "loss")
        assert told == ("FAIL" if point == 3 else "COMPLETE")
    assert alive.calls == []  # nothing was left RUNNING between points
    rows = trial_rows(sweep, STUDY)
    assert [r["point"] for r in rows] == list(range(8))
    assert [r["state"] for r in rows].count("COMPLETE") == 7
    assert [r["point"] for r in rows if r["state"] == "FAIL"] == [3]
    for r in rows:
        if r["state"] == "COMPLETE":
            params = r["params"]
            assert isinstance(params, dict)
            assert r["value"] == pytest.approx((params["x"] - 2) ** 2)
    assert _attrs(sweep, 3)[trials.JOB] == "123_3"
    assert "exited with code 1" in _attrs(sweep, 3)[trials.FAIL_REASON]
    assert (sweep / trials.JOURNAL).is_file()
    assert capfd.readouterr().err == ""  # no Optuna INFO lines in the job's log


def test_a_dead_point_is_failed_by_the_next_ask(sweep: Path) -> None:
    ask(sweep, STUDY, X, 0, "123_0", Alive())
    gone = Alive(living=())
    number, _ = ask(sweep, STUDY, X, 1, "123_1", gone)
    assert number == 1
    assert gone.calls == [[0]]
    assert _states(sweep) == {0: "FAIL", 1: "RUNNING"}
    assert "point 0 left the queue" in _attrs(sweep, 0)[trials.FAIL_REASON]
    # The dead point's late tell changes nothing.
    assert tell(sweep, STUDY, 0, 0, {"loss": 1.0}, "loss") == "FAIL"
    assert _states(sweep)[0] == "FAIL"


def test_a_queued_point_keeps_its_trial(sweep: Path) -> None:
    ask(sweep, STUDY, X, 0, "123_0", Alive())
    queued = Alive(living=[0])
    ask(sweep, STUDY, X, 1, "123_1", queued)
    assert queued.calls == [[0]]
    assert _states(sweep) == {0: "RUNNING", 1: "RUNNING"}


def test_a_requeued_point_resumes_its_trial(sweep: Path) -> None:
    ask(sweep, STUDY, X, 0, "123_0", Alive(living=[0]))
    first = ask(sweep, STUDY, X, 5, "123_5", Alive(living=[0]))
    never = Alive()
    again = ask(sweep, STUDY, X, 5, "123_5", never)
    assert again == first
    assert never.calls == []
    assert len(trial_rows(sweep, STUDY)) == 2
    assert tell(sweep, STUDY, 5, 0, {"loss": 0.5}, "loss") == "COMPLETE"


@pytest.mark.parametrize(
    ("result", "why"),
    [
        (None, "without a result"),
        ({}, "no metric 'loss'"),
        ({"acc": 0.9}, "no metric 'loss'"),
        ({"loss": float("nan")}, "not finite"),
        ({"loss": True}, "not a number"),
        ({"loss": "0.5"}, "not a number"),
    ],
)
def test_exit_zero_without_a_usable_metric_fails(
    sweep: Path, result: dict[str, object] | None, why: str
) -> None:
    ask(sweep, STUDY, X, 0, "123_0", Alive())
    assert tell(sweep, STUDY, 0, 0, result, "loss") == "FAIL"
    assert _states(sweep) == {0: "FAIL"}
    assert why in _attrs(sweep, 0)[trials.FAIL_REASON]


def test_tell_without_a_running_trial(sweep: Path) -> None:
    assert tell(sweep, STUDY, 9, 0, {"loss": 1.0}, "loss") == "FAIL"
    assert trial_rows(sweep, STUDY) == []


def test_a_second_tell_of_a_finished_trial_is_harmless(sweep: Path) -> None:
    import optuna
    from optuna.trial import TrialState

    ask(sweep, STUDY, X, 0, "123_0", Alive())
    study = optuna.load_study(study_name=STUDY, storage=trials.storage(sweep))
    seen_running = study.trials[0]
    # Another process tells between this one's read and its tell.
    assert tell(sweep, STUDY, 0, 0, {"loss": 2.0}, "loss") == "COMPLETE"
    assert not trials._finish(study, seen_running, TrialState.FAIL, reason="late")
    assert not trials._finish(study, seen_running, TrialState.COMPLETE, value=1.0)
    assert trial_rows(sweep, STUDY)[0]["value"] == 2.0


def test_fail_stale(sweep: Path) -> None:
    for point in (0, 1, 2):
        ask(sweep, STUDY, X, point, f"7_{point}", Alive(living=[0, 1, 2]))
    tell(sweep, STUDY, 2, 0, {"loss": 1.0}, "loss")
    status = Alive(living=[1])
    assert fail_stale(sweep, STUDY, status) == [0]
    assert status.calls == [[0, 1]]
    assert _states(sweep) == {0: "FAIL", 1: "RUNNING", 2: "COMPLETE"}
    assert fail_stale(sweep, STUDY, Alive()) == [1]
    nothing = Alive()
    assert fail_stale(sweep, STUDY, nothing) == []
    assert nothing.calls == []  # no RUNNING trial: no squeue


def test_a_trial_that_died_inside_ask(sweep: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import optuna

    optuna.load_study(study_name=STUDY, storage=trials.storage(sweep)).ask()  # no point attr
    assert fail_stale(sweep, STUDY, Alive()) == []  # young: an ask still in progress
    monkeypatch.setattr(trials, "UNLABELLED_GRACE", trials.timedelta(0))
    assert fail_stale(sweep, STUDY, Alive()) == [0]


def test_no_journal_yet(tmp_path: Path) -> None:
    assert fail_stale(tmp_path, STUDY, Alive()) == []
    assert trial_rows(tmp_path, STUDY) == []
    assert not (tmp_path / trials.JOURNAL).exists()


def test_ask_without_a_study(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        ask(tmp_path, STUDY, X, 0, "1_0", Alive())
    assert "no study 'sw1'" in info.value.problem


def test_create_study_direction(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        create_study(tmp_path, STUDY, "down")
    assert info.value.field == "--direction"
    create_study(tmp_path, STUDY, "maximize")
    create_study(tmp_path, STUDY, "maximize")  # again: same study, same direction
    with pytest.raises(UserError) as info:
        create_study(tmp_path, STUDY, "minimize")
    assert "already has direction maximize" in info.value.problem


def _asker(sweep_dir: str, points: list[int], start: Any, out: Any) -> None:
    """One batch host: waits for the other, then asks for each of its points and tells."""
    path = Path(sweep_dir)
    start.wait(60)
    for point in points:
        number, params = ask(path, STUDY, X, point, f"9_{point}", lambda p: set(p))
        out.put((point, number))
        tell(path, STUDY, point, 0, {"loss": (float(str(params["x"])) - 2) ** 2}, "loss")


def test_two_processes_never_share_a_trial(sweep: Path) -> None:
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters, like two batch hosts
    start = ctx.Barrier(2)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_asker, args=(str(sweep), pts, start, out))
        for pts in ([0, 1, 2, 3], [4, 5, 6, 7])
    ]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in range(8)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sorted(point for point, _ in got) == list(range(8))
    assert sorted(number for _, number in got) == list(range(8))
    rows = trial_rows(sweep, STUDY)
    assert len(rows) == 8
    assert {r["number"]: r["point"] for r in rows} == {n: p for p, n in got}
    assert all(r["state"] == "COMPLETE" for r in rows)


# --- a point's end comes after its tell --------------------------------------------------
# `sweep status` fails the RUNNING trial of a point whose record has ended (fail_stale): a
# status between a point's end event and its tell failed a trial the tell would have
# completed (CI35: 2 of 8 trials FAIL where 1 point failed).


def test_the_array_script_tells_the_trial_before_the_points_end_event(tmp_path: Path) -> None:
    from builders import cli_spec
    from hpclaunch.records.runpaths import RunPaths
    from hpclaunch.sweeps import script

    sweep = RunPaths("S", tmp_path / "S", tmp_path / "S" / "checkpoints")
    text = script.array_script(cli_spec({}), sweep, tmp_path, 4, trial_cmd=["trial-cmd"])
    lines = text.splitlines()
    [tell] = [i for i, line in enumerate(lines) if line.startswith("trial-cmd tell ")]
    ends = [i for i, line in enumerate(lines) if line.startswith("printf ") and "exit_code" in line]
    [end] = ends
    assert tell < end < len(lines) - 1 and lines[-1] == 'exit "$HPCLAUNCH_RC"', lines[tell:]


def test_a_packed_point_is_told_before_its_end_event(tmp_path: Path) -> None:
    from hpclaunch.node import pack_agent

    point_dir = tmp_path / "points" / "3"
    point_dir.mkdir(parents=True)
    seen = tmp_path / "seen"
    # The tell records whether the point's end event was already there when it ran.
    check = (
        "import os, sys; events = os.path.join(sys.argv[1], 'events.jsonl'); "
        "ended = os.path.exists(events) and 'point_end' in open(events).read(); "
        f"open({str(seen)!r}, 'w').write(' '.join(sys.argv[2:]) + (' ended' if ended else ''))"
    )
    pack = {"token": "@P@", "point_dir": str(tmp_path / "points" / "@P@"),
            "ask": [sys.executable, "-c", check, str(point_dir)],
            "sweep_dir": str(tmp_path), "pack_dir": str(tmp_path)}  # fmt: skip
    (tmp_path / pack_agent.DONE).mkdir()
    point = pack_agent.Point(pack, {"slot": 0, "gpus": [], "cpus": []}, 3, "77_0")
    pack_agent.finish(pack, point, 0, "")
    assert seen.read_text() == f"tell {tmp_path} 3 0"
    assert '"event": "point_end"' in (point_dir / "events.jsonl").read_text()
    assert (tmp_path / pack_agent.DONE / "3").exists()
