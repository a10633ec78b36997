"""What writing a sweep's point folders costs the file system (issue 26, Performance:
a held 1,000-point sweep to its id). Behaviour, not timing: no mkdir that fails and is
retried."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from hpclaunch.cli.main import main
from hpclaunch.records import runrecord, sweeprecord


def _sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, points: int) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith(("SLURM", "HPCLAUNCH"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    values = ",".join(str(i) for i in range(points))
    argv = ["sweep", "--cluster", "local", "--grid", f"x={values}", "--", sys.executable]
    with pytest.raises(SystemExit) as done:
        main([*argv, "-c", "pass", "{x}"])
    assert done.value.code in (0, None)
    return next((tmp_path / "runs" / "default").iterdir())


def test_point_folders_are_made_without_failed_mkdirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """logs/ with parents=True first failed (no point folder yet): a fourth mkdir and a
    Python exception per point."""
    failed: list[Any] = []
    real = os.mkdir

    def counting(path: Any, *args: Any, **kwargs: Any) -> None:
        try:
            real(path, *args, **kwargs)
        except FileNotFoundError:
            failed.append(path)
            raise

    monkeypatch.setattr(os, "mkdir", counting)
    sweep_dir = _sweep(tmp_path, monkeypatch, 5)
    points = sorted((sweep_dir / "points").iterdir())
    assert len(points) == 5
    for point in points:
        assert (point / "logs").is_dir() and (point / "checkpoints").is_dir()
        # The point's parameters travel in its job.sh (no params.env per point).
        assert f"export HPCLAUNCH_PARAM_X={point.name}\n" in (point / "job.sh").read_text()
    assert [p for p in failed if "points" in str(p)] == []


def _planned_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, points: int) -> Any:
    """A local grid sweep planned and written (start), its points not run."""
    from hpclaunch import launching
    from hpclaunch.sweeps import submit
    from hpclaunch.sweeps.plans import SweepOptions

    monkeypatch.chdir(tmp_path)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPCLAUNCH"))}
    environ["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    values = ",".join(str(i) for i in range(points))
    program = (sys.executable, "-c", "pass", "{x}", "{y}")
    options = {"cluster": "local", "run_root": str(tmp_path / "runs")}
    req = launching.LaunchRequest(options, program, tmp_path, environ)
    sp = submit.plan_sweep(req, SweepOptions(grids=(f"x={values}", "y=a b,'q\"")))
    submit.start(req, sp)
    return sp


def test_point_records_are_made_once_not_per_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A RunRecord and its asdict per point were two thirds of a held 1,000-point
    submission: one record is made, the other points' laid over it."""
    from hpclaunch.records import runrecord

    made: list[int] = []
    real = runrecord.RunRecord.to_dict

    def counting(self: runrecord.RunRecord) -> dict[str, Any]:
        made.append(1)
        return real(self)

    monkeypatch.setattr(runrecord.RunRecord, "to_dict", counting)
    sp = _planned_sweep(tmp_path, monkeypatch, 20)
    assert len(sp.points) == 40
    assert len(made) <= 2


def test_point_records_say_what_a_record_made_per_point_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every point's record, as any reader reads it (records/runrecord.read_raw), holds
    what folder.point_record makes for that point (its own id, folders, parameters and
    command), but the time of writing; no point's run.json is written at submission (the
    record is made from sweep.json), and the first change writes it, the rest kept."""
    from hpclaunch.sweeps import folder

    sp = _planned_sweep(tmp_path, monkeypatch, 7)
    facts = sp.backend.site_facts()
    for point in sp.points:
        path = sp.paths.run_dir / "points" / str(point.index) / "run.json"
        assert not path.exists()
        stored = runrecord.read_raw(path.parent)
        made = folder.point_record(sp, point, sp.backend.name, None, **facts).to_dict()
        stored.pop("submitted_at"), made.pop("submitted_at")
        assert stored == made
        assert stored["params"] == dict(point.params) and stored["point"] == point.index
        assert stored["run_dir"] == str(path.parent)
    first = sp.paths.run_dir / "points" / "3"
    before = runrecord.read_raw(first)
    runrecord.update(first, state="RUNNING")
    assert (first / "run.json").is_file()
    assert runrecord.read_raw(first) == {**before, "state": "RUNNING"}
    assert runrecord.read_raw(sp.paths.run_dir / "points" / "4")["state"] == "PENDING"


def test_sweep_json_is_written_by_the_c_encoder_and_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sweep.json's point table through json's pure-Python encoder (indent=) was a tenth
    of a held 1,000-point submission, twice (written, then the arrays added)."""
    import json
    import json.encoder

    slow: list[int] = []
    real = json.encoder._make_iterencode

    def counting(*args: Any, **kwargs: Any) -> Any:
        slow.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(json.encoder, "_make_iterencode", counting)
    points = [{"index": i, "params": {"a": str(i), "b": "x\ny"}} for i in range(50)]
    data = {"sweep_id": "s", "points": points, "arrays": [], "ünï": None}
    (tmp_path / "s").mkdir(mode=0o700)
    sweeprecord.write(tmp_path / "s", data)
    assert slow == []
    assert sweeprecord.load(tmp_path / "s") == data
    assert (tmp_path / "s" / "sweep.json").stat().st_mode & 0o777 == 0o600
    assert sweeprecord.update(tmp_path / "s", arrays=[{"job_id": "1"}])["points"] == points
    assert json.loads((tmp_path / "s" / "sweep.json").read_text())["arrays"] == [{"job_id": "1"}]
    assert sorted(os.listdir(tmp_path / "s")) == ["sweep.json"]  # nothing aside left


def test_submitting_imports_no_status_wait_or_local_modules() -> None:
    """The sweep command's submitting path (cli.sweep_report) leaves status, wait and
    local points' modules unimported: start-up is part of the time to the sweep id."""
    import subprocess

    probe = (
        "import sys, hpclaunch.cli.sweep_cmd, hpclaunch.cli.sweep_report; "
        "print(' '.join(m for m in ('hpclaunch.sweeps.ops', 'hpclaunch.sweeps.local', "
        "'hpclaunch.backends.sweepstate') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


NASTY_VALUES = ["a b\nc", 'it\'s "q" $HOME `x` \\', "ünï €", "", "x=1;y"]


def test_a_points_line_of_params_sh_gives_its_task_every_value_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """params.sh replaces a params.env per point: the array script's own lines (mapfile,
    source) give point i exactly the variables params.env gave it."""
    import subprocess

    from hpclaunch import launching
    from hpclaunch.sweeps import script, submit
    from hpclaunch.sweeps.plans import SweepOptions
    from hpclaunch.sweeps.points import Point

    monkeypatch.chdir(tmp_path)
    options = {"cluster": "local", "run_root": str(tmp_path / "runs")}
    req = launching.LaunchRequest(
        options, ("true", "{v}"), tmp_path, {"XDG_DATA_HOME": str(tmp_path)}
    )
    sp = submit.plan_sweep(req, SweepOptions(grids=("v=1,2",)))
    points = [Point(i, {"v": v, "w": str(i)}) for i, v in enumerate(NASTY_VALUES)]
    table = sp.paths.run_dir / "params.sh"
    table.parent.mkdir(parents=True)
    table.write_text("".join(script.params_line("S", 5, p) + "\n" for p in points))
    lines = sp.array_script.splitlines()
    start = next(i for i, line in enumerate(lines) if "mapfile" in line)
    source = "\n".join(line.strip() for line in lines[start : start + 2])
    for point in points:
        probe = f"{source}\nenv -0"
        env = {"PATH": os.environ["PATH"], "HPCLAUNCH_POINT": str(point.index)}
        done = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, check=True)
        seen = dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
        expected = dict(script.point_env("S", 5, point))
        assert {k: seen.get(k) for k in expected} == expected
