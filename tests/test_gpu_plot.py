"""`hpclaunch plot`: a run's GPU samples as a PNG of exactly the asked pixels, the plotted
samples as recorded (--data), matplotlib missing, and a run without samples; on run
folders written the way a job leaves them (helpers: test_gpu_top)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hpclaunch.cli.main import cli
from hpclaunch.errors import UserError
from hpclaunch.node import gpu_watch
from hpclaunch.observe import gpu_metrics, gpu_plot
from test_gpu_top import RUN_ID, _env, make_run, samples, two_by_two, write_csv


def plot(tmp_path: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["plot", *args], env=_env(tmp_path), standalone_mode=False)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_the_default_png_lies_in_the_run_folder(tmp_path: Path) -> None:
    run_dir = two_by_two(tmp_path)
    shown = plot(tmp_path, "last")
    target = run_dir / "metrics" / "gpu-busy.png"
    assert shown.return_value == 0 and shown.stdout == f"{target}\n" and shown.stderr == ""
    assert png_size(target) == (800, 700)  # two nodes: two rows of panels
    shown = plot(tmp_path, RUN_ID, "--metric", "power")
    assert shown.return_value == 0 and png_size(run_dir / "metrics" / "gpu-power.png") == (
        800, 700
    )  # fmt: skip


def test_size_output_and_data_are_exact(tmp_path: Path) -> None:
    run_dir = two_by_two(tmp_path)
    with open(run_dir / "metrics" / "gpu-nid002.csv", "a") as handle:
        handle.write("damaged,line\n" + gpu_watch.csv_lines(samples("nid002", 60, 61))[:-3])
    target, data = tmp_path / "out.png", tmp_path / "out.csv"
    shown = plot(tmp_path, "last", "-o", str(target), "--size", "640x480", "--metric", "mem",
                 "--data", str(data))  # fmt: skip
    assert shown.return_value == 0 and shown.stdout == f"{target}\n"
    assert png_size(target) == (640, 480)
    # The samples as recorded: each node's lines, in node order, header and damage left out.
    written = data.read_bytes().decode()
    assert written.startswith(gpu_watch.HEADER)
    bodies = [(run_dir / "metrics" / f"gpu-{n}.csv").read_text().splitlines(True)
              for n in ("nid001", "nid002")]  # fmt: skip
    recorded = [line for body in bodies for line in body[1:] if line.endswith("\n")]
    recorded.remove("damaged,line\n")
    assert written[len(gpu_watch.HEADER) :] == "".join(recorded)
    assert len(recorded) == 4 * 60 + 1  # nid002's sample 60: GPU 0 only, GPU 1 cut short


def test_without_matplotlib_a_hint_and_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = two_by_two(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    data = tmp_path / "d.csv"
    shown = plot(tmp_path, "last", "--data", str(data))
    assert shown.return_value == 0 and shown.stderr == gpu_plot.HINT + "\n"
    assert data.read_text().count("\n") == 1 + 4 * 60
    shown = plot(tmp_path, "last")
    assert shown.return_value == 1 and shown.stderr == gpu_plot.HINT + "\n"
    assert shown.stdout == "" and not (run_dir / "metrics" / "gpu-busy.png").exists()


def test_a_run_without_samples_is_one_line(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    (run_dir / "logs" / "batch.out").write_text(
        "hpclaunch: gpu watch: no nvidia-smi, rocm-smi, amd-smi on PATH on nid001: no GPU samples\n"
    )
    shown = plot(tmp_path, "last", "--data", str(tmp_path / "d.csv"))
    assert shown.return_value == 1 and shown.stdout == ""
    assert shown.stderr.count("\n") == 1 and shown.stderr.startswith(
        f"hpclaunch: plot: run {RUN_ID} has no GPU samples: no GPU tool on its nodes"
    )
    assert not (tmp_path / "d.csv").exists()


def test_a_bad_size_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    two_by_two(tmp_path)
    shown = plot(tmp_path, "last", "--size", "big")
    assert isinstance(shown.exception, UserError) and "--size" in str(shown.exception)


def test_many_nodes_fill_a_grid(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    for node in range(1, 6):  # five one-GPU nodes: two columns of three rows
        write_csv(run_dir, f"n{node}", [r._replace(node=f"n{node}") for r in samples("x", 0, 5)])
    reader = gpu_metrics.Reader(run_dir)
    reader.update()
    found = reader.series()
    assert [s.node for s in found][::2] == ["n1", "n2", "n3", "n4", "n5"]
    assert gpu_plot.default_size(found) == (800, 500 + 2 * 200)
    target = tmp_path / "grid.png"
    assert gpu_plot.png(RUN_ID, found, "busy", target, (500, 400)) and png_size(target) == (
        500, 400
    )  # fmt: skip
