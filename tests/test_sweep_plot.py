"""`hpclaunch sweep plot`: the plotted numbers (CSV) against the points' own results, the
PNG's pixel size, the text table, matplotlib missing, an Optuna sweep's history, and the
refusals. The sweeps are real local sweeps (no Slurm), run once for the module."""

from __future__ import annotations

import csv
import importlib.util
import json
import statistics
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builders import local_env
from hpclaunch.cli.main import cli
from hpclaunch.errors import UserError
from hpclaunch.sweeps import plot

HPCLAUNCH = str(Path(sys.executable).parent / "hpclaunch")
LRS, OPTS, SEEDS = (0.1, 0.01, 0.001), ("adam", "sgd"), (0, 1)
PROGRAM = """\
import json, os
p = json.loads(os.environ["HPCLAUNCH_PARAMS"])
lr, opt, seed = float(p["lr"]), p["opt"], int(p.get("seed", 0))
result = {"loss": lr * (1 + seed) + (0.3 if opt == "sgd" else 0.0) + 0.02 * seed}
if opt == "adam":
    result["acc"] = 1 - lr
with open(os.environ["HPCLAUNCH_RESULT_FILE"], "w") as fh:
    json.dump(result, fh)
"""
SPACE = """\
lr = {type = "float", low = 1e-4, high = 1e-1, log = true}
opt = {type = "categorical", choices = ["adam", "sgd"]}
"""


def loss(lr: float, opt: str, seed: int) -> float:  # PROGRAM's loss, computed the same way
    return lr * (1 + seed) + (0.3 if opt == "sgd" else 0.0) + 0.02 * seed


def _sweep(root: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [HPCLAUNCH, "sweep", "--cluster", "local", "--max-parallel", "2", *args, "--",
         sys.executable, "prog.py"],
        cwd=root, env=local_env(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A finished 3 x 2 grid with --repeat 2 and a 4-trial Optuna sweep (run side by side)."""
    root = tmp_path_factory.mktemp("plot")
    (root / "prog.py").write_text(PROGRAM)
    (root / "space.toml").write_text(SPACE)
    grid = _sweep(root, "--grid", "lr=0.1,0.01,0.001", "--grid", "opt=adam,sgd", "--repeat", "2")
    optuna = None
    if importlib.util.find_spec("optuna") is not None:
        optuna = _sweep(root, "--optuna", "space.toml", "--trials", "4", "--metric", "loss")
    found: dict[str, Any] = {"root": root}
    for name, proc in (("grid", grid), ("optuna", optuna)):
        if proc is None:
            continue
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        found[name] = out.split()[1]
        found[name + "_dir"] = root / "runs" / "default" / out.split()[1]
    return found


@pytest.fixture()
def here(sweeps: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("XDG_DATA_HOME", str(sweeps["root"] / "xdg"))
    yield sweeps


def _plot(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`hpclaunch sweep plot ARGS` in this process (fast; errors raise UserError)."""
    code = cli.main(args=["sweep", "plot", *args], prog_name="hpclaunch", standalone_mode=False)
    out, err = capsys.readouterr()
    return int(code or 0), out, err


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and list(rows[0]) == ["series", "x", "mean", "std", "n", "min", "max"]
    return rows


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def _check(row: dict[str, str], values: list[float]) -> None:
    """The row holds exactly these numbers (mean, sample std n-1, n, min, max)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    assert float(row["mean"]) == statistics.fmean(values)
    assert float(row["std"]) == std
    assert (int(row["n"]), float(row["min"]), float(row["max"])) == (
        len(values), min(values), max(values)
    )  # fmt: skip


def test_grid_data_and_png(here: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    tmp = here["root"]
    code, out, err = _plot(capsys, here["grid"], "--x", "lr", "--metric", "loss",
                           "--data", str(tmp / "g.csv"), "-o", str(tmp / "g.png"),
                           "--size", "640x480")  # fmt: skip
    assert code == 0 and out == f"{tmp / 'g.png'}\n" and err == ""
    assert _png_size(tmp / "g.png") == (640, 480)
    rows = _csv(tmp / "g.csv")
    assert [(r["series"], r["x"]) for r in rows] == [("loss", "0.001"), ("loss", "0.01"),
                                                     ("loss", "0.1")]  # fmt: skip
    for row, lr in zip(rows, sorted(LRS)):
        _check(row, [loss(lr, o, s) for o in OPTS for s in SEEDS])


def test_by_gives_one_series_per_value(
    here: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp = here["root"]
    code, out, _ = _plot(capsys, here["grid"], "--x", "lr", "--metric", "loss", "--by", "opt",
                         "--logx", "--data", str(tmp / "by.csv"))  # fmt: skip
    default = here["grid_dir"] / "plot-loss-lr.png"
    assert code == 0 and out == f"{default}\n"
    assert _png_size(default) == (800, 500)
    rows = _csv(tmp / "by.csv")
    assert [r["series"] for r in rows] == ["opt=adam"] * 3 + ["opt=sgd"] * 3
    for row in rows:
        opt, lr = row["series"].split("=")[1], float(row["x"])
        _check(row, [loss(lr, opt, s) for s in SEEDS])


def test_text_table_with_categorical_x(
    here: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _plot(capsys, here["grid"], "--x", "opt", "--metric", "loss", "--text")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert "loss against opt" in lines[0]
    assert lines[1].split() == ["SERIES", "OPT", "MEAN", "STD", "N", "MIN", "MAX"]
    body = [line.split() for line in lines[2:]]
    assert [(b[1], b[4]) for b in body] == [("adam", "6"), ("sgd", "6")]  # first-seen order
    adam = [loss(lr, "adam", s) for lr in LRS for s in SEEDS]
    assert body[0][2] == f"{statistics.fmean(adam):.6g}"


def test_without_matplotlib_a_table_and_a_hint(
    here: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    pngs = set(here["grid_dir"].glob("*.png"))
    code, out, err = _plot(capsys, here["grid"], "--x", "lr", "--metric", "loss",
                           "--data", str(here["root"] / "none.csv"))  # fmt: skip
    assert code == 0 and set(here["grid_dir"].glob("*.png")) == pngs
    assert err == "hpclaunch: hint: pip install 'hpclaunch[plot]' for a PNG\n"
    assert out.splitlines()[1].split()[:3] == ["SERIES", "LR", "MEAN"]
    assert len(out.splitlines()) == 2 + 3
    assert len(_csv(here["root"] / "none.csv")) == 3


def test_without_matplotlib_an_asked_for_file_is_an_error_with_the_hint(
    here: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    target = here["root"] / "none.png"
    code, out, err = _plot(capsys, here["grid"], "--x", "lr", "--metric", "loss", "-o",
                           str(target), "--data", str(here["root"] / "none.csv"))  # fmt: skip
    assert code == 1 and not target.exists()  # -o FILE.png asked, nothing written: not 0
    assert err == (f"hpclaunch: error: -o: {target} not written: a PNG needs matplotlib. "
                   "pip install 'hpclaunch[plot]'\n")  # fmt: skip
    assert out.splitlines()[1].split()[:3] == ["SERIES", "LR", "MEAN"]
    assert len(_csv(here["root"] / "none.csv")) == 3


def test_points_without_the_metric_are_left_out_in_one_line(
    here: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _plot(capsys, here["grid"], "--x", "lr", "--metric", "acc", "--text")
    assert code == 0
    assert err == (
        "hpclaunch: plot: 6 of 12 points left out: 6 without a finite number acc in result.json\n"
    )
    assert [line.split()[4] for line in out.splitlines()[2:]] == ["2", "2", "2"]


@pytest.mark.parametrize(
    ("args", "field", "words"),
    [
        (["--x", "nope", "--metric", "loss"], "--x", "its parameters: lr, opt, seed"),
        (["--x", "lr", "--by", "nope", "--metric", "loss"], "--by", "'nope' is no parameter"),
        (["--x", "lr", "--by", "lr", "--metric", "loss"], "--by", "is also --x"),
        (["--metric", "loss"], "--x", "parameters: lr, opt, seed"),
        (["--x", "lr"], "--metric", "result keys: loss, acc"),
        (["--x", "lr", "--metric", "nothing"], "--metric", "no completed point"),
        (["--x", "lr", "--metric", "loss", "--size", "800"], "--size", "WIDTHxHEIGHT"),
        (["--x", "lr", "--metric", "loss", "--size", "9x9"], "--size", "50 to 10000"),
        (["--x", "opt", "--metric", "loss", "--logx"], "--logx", "not positive numbers"),
        (["--x", "lr", "--metric", "loss", "--history"], "--history", "no --x"),
        (["--x", "lr", "--metric", "loss", "--text", "-o", "a.png"], "--text", "instead"),
    ],
)
def test_refusals(
    here: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    field: str,
    words: str,
) -> None:
    with pytest.raises(UserError) as info:
        _plot(capsys, here["grid"], *args)
    assert info.value.field == field and words in str(info.value)
    assert "\n" not in info.value.line()


def _optuna_points(sweep_dir: Path) -> list[tuple[dict[str, Any], float]]:
    found = []
    for index in range(4):
        folder = sweep_dir / "points" / str(index)
        params = json.loads((folder / "params.json").read_text())
        found.append((params, json.loads((folder / "result.json").read_text())["loss"]))
    return found


def test_optuna_history(here: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    if "optuna" not in here:
        pytest.skip("optuna is not installed")
    tmp, losses = here["root"], [v for _, v in _optuna_points(here["optuna_dir"])]
    code, out, _ = _plot(capsys, here["optuna"], "--data", str(tmp / "h.csv"), "--size", "321x207")
    assert code == 0 and out == f"{here['optuna_dir'] / 'plot-loss-history.png'}\n"
    assert _png_size(here["optuna_dir"] / "plot-loss-history.png") == (321, 207)
    rows = _csv(tmp / "h.csv")
    running = [min(losses[: i + 1]) for i in range(4)]
    assert [(r["series"], r["x"], float(r["mean"])) for r in rows] == [
        *(("loss", str(i), v) for i, v in enumerate(losses)),
        *(("best (minimize)", str(i), v) for i, v in enumerate(running)),
    ]
    code, out, _ = _plot(capsys, here["optuna"], "--text")
    assert out.splitlines()[1].split() == ["POINT", "LOSS", "BEST"]
    # the table prints 6 significant digits
    assert [float(line.split()[2]) for line in out.splitlines()[2:]] == pytest.approx(
        running, rel=1e-5
    )


def test_optuna_against_a_parameter(
    here: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    if "optuna" not in here:
        pytest.skip("optuna is not installed")
    tmp, points = here["root"], _optuna_points(here["optuna_dir"])
    code, _, _ = _plot(capsys, here["optuna"], "--x", "lr", "--by", "opt", "--logx",
                       "--data", str(tmp / "o.csv"), "-o", str(tmp / "o.png"))  # fmt: skip
    assert code == 0 and _png_size(tmp / "o.png") == (800, 500)
    rows = _csv(tmp / "o.csv")
    assert sorted((r["series"], float(r["x"]), float(r["mean"])) for r in rows) == sorted(
        (f"opt={p['opt']}", p["lr"], v) for p, v in points
    )


def _row(index: int, state: str, params: dict[str, Any], result: Any) -> dict[str, Any]:
    return {"index": index, "state": state, "params": params, "result": result}


def test_series_rules_without_a_sweep() -> None:
    rows = [
        _row(0, "COMPLETED", {"n": "10", "k": "b"}, {"m": 1.0}),
        _row(1, "COMPLETED", {"n": "1e1", "k": "a"}, {"m": 3.0}),  # the same x as 10
        _row(2, "COMPLETED", {"n": 2, "k": "b"}, {"m": 5}),
        _row(3, "FAILED", {"n": 2, "k": "b"}, {"m": 0.0}),
        _row(4, "COMPLETED", {"n": 2, "k": "b"}, {"m": float("nan")}),
        _row(5, "COMPLETED", {"n": 2, "k": "b"}, {"m": True}),
        _row(6, "RUNNING", {"n": 2, "k": "b"}, None),
    ]
    kept, why = plot.usable(rows, "m")
    assert [r["index"] for r in kept] == [0, 1, 2]
    assert why == ["1 FAILED", "1 RUNNING", "2 without a finite number m in result.json"]
    one = plot.series("s", kept, "m", "n", None)
    assert [(t.xv, t.n, t.mean, t.std) for t in one.series[0].stats] == [
        (2.0, 1, 5.0, 0.0),
        (10.0, 2, 2.0, statistics.stdev([1.0, 3.0])),
    ]
    assert plot.series("s", kept, "m", "k", None).categories == ["b", "a"]
    best = plot.history("s", kept, "m", "maximize")
    assert [t.mean for t in best.series[1].stats] == [1.0, 3.0, 5.0]
    assert plot.number_text(2.0) == "2" and plot.number_text(0.001) == "0.001"
