"""hpclaunch.call / hpclaunch.submit (issue 35): a function on every rank of a job, its
results in rank order; a rank's exception raised again with its rank, node and remote
traceback; keyword arguments named like run options; three submits at once; the
payload limit and a big result loaded when read; cloudpickle absent from the job's
Python; the call recorded like any run. Locally here, on the testbed in test_e2e_call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import hpclaunch
from conftest import PROGRAMS
from hpclaunch import node
from hpclaunch.calls import files, typedoptions
from hpclaunch.calls.outcome import Results, outcome
from hpclaunch.config.layering import cli_options

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import tests/
CALL_USER = str(PROGRAMS / "call_user.py")


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"), "HPCLAUNCH_CLUSTER": "local"}
    monkeypatch.chdir(tmp_path)
    return env


def user(env: dict[str, str], cwd: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, CALL_USER, "local", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""  # nothing prints unless asked
    seen: dict[str, Any] = json.loads(proc.stdout)
    return seen


def test_gloo_all_reduce_returns_every_rank_in_order(local: dict[str, str], tmp_path: Path) -> None:
    seen = user(local, tmp_path, "all_reduce")
    # (rank, world, host, sum of (rank + 1) * 0.5 over 4 ranks)
    assert [r[:2] for r in seen["results"]] == [[0, 4], [1, 4], [2, 4], [3, 4]]
    assert {r[3] for r in seen["results"]} == {5.0}


def test_rank_3_raising_gives_its_exception_with_notes(
    local: dict[str, str], tmp_path: Path
) -> None:
    seen = user(local, tmp_path, "raises")
    assert seen["type"] == "ValueError"
    where, remote = seen["notes"]
    assert where.startswith("raised on rank 3, node ") and "FAILED" in where
    assert "fails_on_rank_3" in remote and "ValueError: rank 3 says no" in remote
    assert seen["state"] == "FAILED"
    assert seen["seconds"] < 60  # the other ranks were ended, not left to sleep 120 s
    assert 0 <= seen["ran_seconds"] < 60, seen


def test_keyword_arguments_named_like_run_options_pass_through(
    local: dict[str, str], tmp_path: Path
) -> None:
    assert user(local, tmp_path, "kwargs")["results"] == ["5/x/0"]


def test_three_submits_at_once(local: dict[str, str], tmp_path: Path) -> None:
    seen = user(local, tmp_path, "three")
    assert len(set(seen["ids"])) == 3
    assert seen["results"] == [[f"{i}/t/0", f"{i}/t/1"] for i in range(3)]
    assert seen["done"] == [True, True, True]


def _rank() -> int:
    return int(os.environ["RANK"])


def _sleeps() -> None:
    time.sleep(300)


def test_recorded_like_any_run(local: dict[str, str]) -> None:
    call = hpclaunch.submit(_rank, options={"tasks_per_node": 2, "environ": local})
    assert call.result(timeout=120) == [0, 1]
    (found,) = hpclaunch.runs(environ=local)
    assert found.id == call.run.id and found.state == "COMPLETED"
    assert found.record.command == [f"{__name__}._rank"]
    mode = (call.run.run_dir / files.CALL_DIR / files.PAYLOAD).stat().st_mode
    assert mode & 0o077 == 0  # the pickled call is the user's alone
    assert (call.run.run_dir / files.CALL_DIR / (files.RESULT % 1)).stat().st_mode & 0o077 == 0


def test_submit_done_and_cancel(local: dict[str, str]) -> None:
    call = hpclaunch.submit(_sleeps, options={"environ": local})
    assert not call.done()
    with pytest.raises(TimeoutError):
        call.result(timeout=1)
    call.cancel()
    with pytest.raises(hpclaunch.RemoteError, match=r"rank 0 gave no result: .* CANCELLED"):
        call.result(timeout=60)
    assert call.done()


def test_a_200_mb_closure_is_refused_before_submission(local: dict[str, str]) -> None:
    big = b"x" * (200 << 20)
    with pytest.raises(hpclaunch.UserError) as caught:
        hpclaunch.call(lambda: len(big), options={"environ": local})
    line = str(caught.value)
    assert line.startswith("call: ") and "200.0 MB (limit 100.0 MB)" in line, line
    assert "\n" not in line
    assert hpclaunch.runs(environ=local) == [] and not Path("runs").exists()


def _big_result(size: int) -> bytes:
    return bytes([_rank()]) * size


def test_a_200_mb_result_comes_back_lazily(local: dict[str, str]) -> None:
    results = hpclaunch.call(_big_result, 200 << 20, options={"environ": local})
    assert isinstance(results, Results) and results.lazy == [0]
    assert results.path(0).stat().st_size > 200 << 20
    assert len(results[0]) == 200 << 20 and results.lazy == []
    small = hpclaunch.call(
        _big_result, 10, options={"environ": local, "tasks_per_node": 2, "call_limit": "1K"}
    )
    assert small.lazy == [] and small == [b"\0" * 10, b"\1" * 10]


def test_options_that_are_no_run_options_are_refused(local: dict[str, str]) -> None:
    with pytest.raises(hpclaunch.UserError, match=r"^options: 'nodez' is not a run option"):
        hpclaunch.call(_rank, options={"nodez": 2, "environ": local})
    with pytest.raises(hpclaunch.UserError, match=r"^nodes: '2' is a str"):
        hpclaunch.call(_rank, options={"nodes": "2", "environ": local})


def test_shared_file_names_equal_the_hosts() -> None:
    shipped = node.path(files.CALL_RANK).read_text()
    for name in ("CALL_DIR", "PAYLOAD", "RESULT", "ERROR", "LIB"):
        assert f"{name} = {getattr(files, name)!r}" in shipped.replace('"', "'"), name


def test_the_job_python_needs_no_cloudpickle(tmp_path: Path) -> None:
    """The rank's side with a Python that lacks cloudpickle: the shipped copy serves."""
    bare = "/usr/bin/python3"
    lacks = subprocess.run([bare, "-I", "-c", "import cloudpickle"], capture_output=True)
    if lacks.returncode == 0 or not Path(bare).exists():
        pytest.skip(f"{bare} has cloudpickle (or is missing)")
    for name, data in files.run_files(files.payload(_rank, (), {}, files.DEFAULT_LIMIT)):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    env = {"HPCLAUNCH_RUN_DIR": str(tmp_path), "RANK": "3", "PATH": "/usr/bin:/bin"}
    subprocess.run(
        list(files.program(bare)), env=env, cwd=tmp_path, check=True, capture_output=True
    )
    assert cloudpickle.loads((tmp_path / "call" / "result-3.pkl").read_bytes()) == 3


def test_a_job_python_of_another_minor_is_refused_before_submission(
    local: dict[str, str], tmp_path: Path
) -> None:
    image = tmp_path / "image"
    (image / "usr" / "bin").mkdir(parents=True)
    (image / "usr" / "bin" / "python3").symlink_to("python3.7")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")  # a venv's shape, for planning
    (venv / "bin" / "python").chmod(0o755)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.8.18\n")
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for options, line in (
        ({"container": str(image)}, f"container: {image} has Python 3.7 ("),
        ({"venv": "venv"}, f"venv: {venv} has Python 3.8 ("),
    ):
        with pytest.raises(hpclaunch.UserError) as caught:
            hpclaunch.call(_rank, options={**options, "environ": local})
        assert str(caught.value).startswith(line), caught.value
        assert f"with Python {mine}" in str(caught.value)
    assert not Path("runs").exists()


def test_a_rank_of_another_python_says_so(tmp_path: Path) -> None:
    """What the host cannot see (an image file, a venv inside an image): the rank checks."""
    for name, data in files.run_files(files.payload(_rank, (), {}, files.DEFAULT_LIMIT)):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    payload = tmp_path / "call" / "payload.pkl"
    header, _, blob = payload.read_bytes().partition(b"\n")
    payload.write_bytes(header.replace(b"python=3.", b"python=2.") + b"\n" + blob)
    env = {"HPCLAUNCH_RUN_DIR": str(tmp_path), "RANK": "0"}
    done = subprocess.run(list(files.program(sys.executable)), env=env, capture_output=True)
    assert done.returncode == 1
    with pytest.raises(RuntimeError, match=r"^the job's Python is 3\.\d+, the caller's 2\."):
        outcome(tmp_path / "call", 1, files.DEFAULT_LIMIT, lambda: "ended")


def _rank_side(
    tmp_path: Path, fn: Any, *flags: str, args: tuple[Any, ...] = (), cloudpickle_version: str = ""
) -> str:
    """Run one rank of a call of `fn(*args)` here with the interpreter's `flags`; its
    stderr. `cloudpickle_version`: the one the payload's header names instead."""
    for name, data in files.run_files(files.payload(fn, args, {}, files.DEFAULT_LIMIT)):
        if name.endswith(files.PAYLOAD) and cloudpickle_version:
            header, _, blob = data.partition(b"\n")
            mine = f"cloudpickle={cloudpickle.__version__}".encode()
            assert mine in header, header
            data = header.replace(mine, f"cloudpickle={cloudpickle_version}".encode())
            data += b"\n" + blob
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    python, *rest = files.program(sys.executable)
    env = {"HPCLAUNCH_RUN_DIR": str(tmp_path), "RANK": "0"}
    done = subprocess.run([python, *flags, *rest], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "call" / "result-0.pkl").exists()
    return done.stderr


def test_a_rank_imports_only_what_the_call_needs(tmp_path: Path) -> None:
    """The call's added cost is the rank's imports: a function of an importable module
    needs no cloudpickle; one pickled by value loads cloudpickle's shipped bytecode
    (compiled once by the caller), never its sources."""
    by_reference = _rank_side(tmp_path / "ref", os.getcwd, "-X", "importtime")
    assert "cloudpickle" not in by_reference and "runpy" not in by_reference
    # A class of the caller's (pickled by value) needs cloudpickle's own rebuilders.
    by_value = _rank_side(tmp_path / "value", _names_a_class, "-v")
    shipped = tmp_path / "value" / "call" / "lib" / "cloudpickle"
    assert f"code object from '{shipped}/__pycache__/cloudpickle.cpython-" in by_value
    assert cloudpickle.loads((shipped.parents[1] / "result-0.pkl").read_bytes()) == 2


class _Point:
    x = 1

    def doubled(self) -> int:  # a method: a function rebuilt inside a class cloudpickle rebuilds
        return self.x * 2


def _names_a_class() -> int:
    return _Point().doubled()


def _factorial(n: int) -> int:
    return 1 if n <= 1 else n * _factorial(n - 1)


def _python_major() -> int:
    return sys.version_info[0]


def _closures() -> list[Any]:
    """Functions pickled by value in the ways a notebook makes them."""
    count = [3]

    def adds(x: int, by: int = 2, *, times: int = 4) -> int:
        """adds doc"""
        return (x + by + len(count)) * times

    def tagged() -> str:
        return str(tagged.tag)  # type: ignore[attr-defined]  # its own cell and attribute

    tagged.tag = "t"  # type: ignore[attr-defined]

    def never_bound() -> int:
        return unbound  # an empty cell

    if count == []:
        unbound = 0
    return [adds, tagged, never_bound, lambda: _factorial(5), _python_major]


def _apply_all(functions: list[Any]) -> list[Any]:
    seen: list[Any] = []
    for fn in functions:
        try:
            value = fn(1) if fn.__name__ == "adds" else fn()
        except NameError as exc:
            value = f"NameError {exc}"
        facts = ("__name__", "__qualname__", "__doc__", "__defaults__", "__kwdefaults__")
        seen.append((value, [getattr(fn, name) for name in facts], fn.__annotations__))
    return seen


def test_a_function_pickled_by_value_loads_without_cloudpickle(tmp_path: Path) -> None:
    """A notebook's function (pickled by value) is rebuilt by callrank's own copies of
    cloudpickle's function rebuilders: cloudpickle's import (~40 ms a rank) is the
    call's added cost otherwise. The functions behave and look as they do here."""
    functions = _closures()
    stderr = _rank_side(tmp_path / "own", _apply_all, "-X", "importtime", args=(functions,))
    imported = {line.rpartition("|")[2].strip() for line in stderr.splitlines()}
    assert "cloudpickle" not in imported and "re" not in imported, stderr
    result = tmp_path / "own" / "call" / "result-0.pkl"
    assert cloudpickle.loads(result.read_bytes()) == _apply_all(functions)
    # A cloudpickle whose rebuilders callrank does not know: its own, shipped, serve.
    stderr = _rank_side(
        tmp_path / "other", _apply_all, "-v", args=(functions,), cloudpickle_version="9.0"
    )
    assert "/call/lib/cloudpickle/__pycache__/cloudpickle.cpython-" in stderr
    result = tmp_path / "other" / "call" / "result-0.pkl"
    assert cloudpickle.loads(result.read_bytes()) == _apply_all(functions)


class _Unpicklable(Exception):
    def __init__(self) -> None:
        import threading

        super().__init__("holds a lock")
        self.lock = threading.Lock()


def _raises_unpicklable() -> None:
    raise _Unpicklable()


def test_an_exception_that_does_not_pickle_is_a_remote_error(local: dict[str, str]) -> None:
    with pytest.raises(hpclaunch.RemoteError) as caught:
        hpclaunch.call(_raises_unpicklable, options={"environ": local})
    exc = caught.value
    assert str(exc) == f"{__name__}._Unpicklable: holds a lock"
    assert exc.remote_type == f"{__name__}._Unpicklable" and exc.rank == 0 and exc.node
    assert "_raises_unpicklable" in exc.remote_traceback
    assert exc.__notes__[0].startswith("raised on rank 0, node ")


def test_without_cloudpickle_call_says_how_to_get_it(
    local: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = files.importlib.import_module

    def no_cloudpickle(name: str, package: str | None = None) -> Any:
        if name == "cloudpickle":
            raise ImportError(name)
        return real(name, package)

    monkeypatch.setattr(files.importlib, "import_module", no_cloudpickle)
    with pytest.raises(hpclaunch.UserError) as caught:
        hpclaunch.call(_rank, options={"environ": local})
    assert str(caught.value) == (
        "call: cloudpickle is not installed here (hpclaunch.call pickles the function "
        "with it). pip install 'hpclaunch[call]' (or pip install cloudpickle)"
    )
    assert not Path("runs").exists()


def _says_hello() -> str:
    print(f"hello from rank {_rank()}")
    return "done"


def _cli(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "hpclaunch", *args], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_the_cli_shows_a_call_under_its_functions_name(local: dict[str, str]) -> None:
    """runs, status, show and logs see a call as a run, named by its function (the job
    name too, which squeue shows), not by the interpreter that runs it."""
    call = hpclaunch.submit(_says_hello, options={"tasks_per_node": 2, "environ": local})
    assert call.result(timeout=120) == ["done", "done"]
    name = f"{__name__}._says_hello"
    (row,) = [line for line in _cli(local, "runs").splitlines() if call.run.id in line]
    assert row.split()[6] == name, row  # the NAME column
    assert call.run.record.job_name == name
    assert "COMPLETED" in _cli(local, "status", call.run.id)
    assert json.loads(_cli(local, "show", call.run.id, "--json"))["record"]["command"] == [name]
    shown = _cli(local, "logs", call.run.id)
    assert "hello from rank 0" in shown and "hello from rank 1" in shown


def test_options_may_be_the_typed_run_options(
    local: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """options= takes hpclaunch.RunOptions (the typed options object) as well as a
    mapping: its typed values (seconds, MB, bytes) go through the layers as given."""
    raw = {
        "cluster": "local",
        "tasks_per_node": 2,
        "time": "1-02:03:04",
        "mem": "2G",
        "snapshot_limit": "64K",
        "no_snapshot": True,
        "env": ["A=1"],
        "exp": "typed",
    }
    typed = cli_options(raw)
    assert cli_options(typedoptions.given(typed)) == typed  # every kind reads back the same
    for key in ("XDG_DATA_HOME", "HPCLAUNCH_CLUSTER"):
        monkeypatch.setenv(key, local[key])
    call = hpclaunch.submit(_rank, options=typed)
    assert call.result(timeout=120) == [0, 1]
    assert call.run.record.exp == "typed" and call.run.record.options["time"] == "1-02:03:04"
    with pytest.raises(hpclaunch.UserError, match=r"^options\.snapshot_limit: 1000 bytes"):
        hpclaunch.call(_rank, options=hpclaunch.RunOptions(snapshot_limit=1000))
