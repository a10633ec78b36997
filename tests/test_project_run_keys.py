"""hpclaunch.toml [run]: underscore keys as the API spells them, and a project file's
gpus-per-node against a local run (this machine's GPUs counted, or one line naming the
key to drop). Issue #28 item 8."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpclaunch.errors import UserError
from hpclaunch.planning import preparing

ENV = {"USER": "alice", "PATH": "/usr/bin:/bin"}


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    tools = tmp_path / "tools"
    tools.mkdir()
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")  # no GPU tools unless a test adds one


def _resolve(tmp: Path, toml: str, cli: dict[str, object]) -> preparing.Prepared:
    (tmp / "hpclaunch.toml").write_text(toml)
    environ = {**ENV, "XDG_CONFIG_HOME": os.environ["XDG_CONFIG_HOME"]}
    return preparing.prepare_spec(cli, ("python", "train.py"), tmp, environ)


def test_underscore_keys_are_the_dashed_options(tmp_path: Path) -> None:
    toml = "[run]\ntasks_per_node = 3\ncpus_per_task = 2\nno_watch = true\n"
    spec = _resolve(tmp_path, toml, {"cluster": "local"}).spec
    assert (spec.tasks_per_node, spec.cpus_per_task) == (3, 2)
    assert dict(spec.sources)["tasks_per_node"] == "project"


def test_a_key_in_both_spellings_is_refused(tmp_path: Path) -> None:
    toml = "[run]\ntasks-per-node = 2\ntasks_per_node = 4\n"
    with pytest.raises(UserError) as caught:
        _resolve(tmp_path, toml, {"cluster": "local"})
    line = str(caught.value)
    assert "[run] tasks_per_node" in line and "given twice, also as tasks-per-node" in line
    assert "\n" not in line


def test_an_unknown_underscore_key_is_still_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"\[run\] tasks_per_nod: unknown key"):
        _resolve(tmp_path, "[run]\ntasks_per_nod = 2\n", {"cluster": "local"})


def test_project_gpus_on_a_machine_without_gpus_name_the_key(tmp_path: Path) -> None:
    toml = "[run]\ngpus-per-node = 8\n"
    with pytest.raises(UserError) as caught:
        _resolve(tmp_path, toml, {"cluster": "local"})
    line = str(caught.value)
    assert line.startswith("hpclaunch.toml [run] gpus-per-node: 8 GPUs per node on this machine")
    assert "it has 0" in line and "--gpus-per-node 0" in line and "drop gpus-per-node" in line
    spec = _resolve(tmp_path, toml, {"cluster": "local", "gpus_per_node": "0"}).spec
    assert spec.gpus_per_node == 0


@pytest.mark.parametrize(
    ("tool", "listing"),
    [
        ("nvidia-smi", "GPU 0: NVIDIA A100 (UUID: GPU-1)\nGPU 1: NVIDIA A100 (UUID: GPU-2)\n"),
        # The JSON listings hpclaunch asks for (tests/doubles/gpu emulates rocm-smi's).
        ("amd-smi", '[{"gpu": 0, "bdf": "0000:c1:00.0"}, {"gpu": 1, "bdf": "0000:c6:00.0"}]'),
        ("rocm-smi", '{"card0": {"Device ID": "0x740c"}, "card1": {"Device ID": "0x740c"}}'),
    ],
)
def test_project_gpus_are_counted_on_this_machine(tmp_path: Path, tool: str, listing: str) -> None:
    fake = tmp_path / "tools" / tool
    fake.write_text(f"#!/bin/sh\nprintf '%s' '{listing}'\n")
    fake.chmod(0o755)
    spec = _resolve(tmp_path, "[run]\ngpus-per-node = 2\n", {"cluster": "local"}).spec
    assert spec.gpus_per_node == 2
    with pytest.raises(UserError, match=r"8 GPUs per node on this machine.*it has 2"):
        _resolve(tmp_path, "[run]\ngpus-per-node = 8\n", {"cluster": "local"})
