"""A profile's arch (issue 31: Alps, JUPITER and Isambard-AI are aarch64) against what
hpclaunch ships to the nodes: --profiler py-spy copies this side's py-spy binary into the
run folder, so one built for another CPU is refused before anything is written, not
found broken in the rank after the queue. The binaries here are ELF headers alone: the
check reads e_machine (basics/elfarch.py), nothing runs them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpclaunch.basics.elfarch import machine_of
from hpclaunch.errors import UserError
from hpclaunch.planning import preparing

# e_machine (bytes 18-19, little-endian): EM_X86_64 = 62, EM_AARCH64 = 183.
MACHINES = {"x86_64": 62, "aarch64": 183}


def fake_elf(folder: Path, arch: str) -> Path:
    """An executable 'py-spy' whose ELF header says it is built for `arch`."""
    folder.mkdir(parents=True, exist_ok=True)
    header = b"\x7fELF\x02\x01\x01" + bytes(11) + MACHINES[arch].to_bytes(2, "little")
    path = folder / "py-spy"
    path.write_bytes(header + bytes(44))
    path.chmod(0o700)
    return path


def test_the_elf_header_says_the_machine(tmp_path: Path) -> None:
    assert machine_of(fake_elf(tmp_path / "x", "x86_64")) == "x86_64"
    assert machine_of(fake_elf(tmp_path / "a", "aarch64")) == "aarch64"
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\n")
    assert machine_of(script) is None and machine_of(tmp_path / "none") is None


def _prepare(site: str, pyspy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(pyspy.parent / "nopython" / "python3"))
    cli = {"cluster": site, "nodes": "2", "account": "proj1", "time": "1:00:00",
           "gpus_per_node": "4", "profile_ranks": "0", "profiler": "py-spy"}  # fmt: skip
    env = {"USER": "alice", "HOME": "/users/alice", "PATH": f"{pyspy.parent}:/usr/bin:/bin"}
    preparing.prepare_spec(cli, ("python", "train.py"), Path("/project/alice/llm"), env)


@pytest.mark.parametrize("site", ["alps", "jupiter", "isambard-ai"])
def test_an_x86_py_spy_is_refused_for_aarch64_nodes(
    site: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UserError) as caught:
        _prepare(site, fake_elf(tmp_path / "bin", "x86_64"), monkeypatch)
    said = str(caught.value)
    assert said.startswith("--profiler: py-spy ") and "is built for x86_64" in said
    assert "nodes are aarch64" in said and "manylinux2014_aarch64" in said
    _prepare(site, fake_elf(tmp_path / "arm", "aarch64"), monkeypatch)  # the right one


def test_an_aarch64_py_spy_is_refused_for_x86_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UserError) as caught:
        _prepare("leonardo", fake_elf(tmp_path / "bin", "aarch64"), monkeypatch)
    assert "is built for aarch64" in str(caught.value)
    _prepare("leonardo", fake_elf(tmp_path / "x86", "x86_64"), monkeypatch)


def test_remote_setup_fetches_wheels_for_the_clusters_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`remote setup` asks pip for wheels of the machine the cluster's probe reported (an
    aarch64 login node on Alps, JUPITER, Isambard-AI), never for this one's."""
    import subprocess

    from hpclaunch.remote import wheels

    asked: list[list[str]] = []

    def pip(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(wheels.subprocess, "run", pip)
    wheels.dependencies(tmp_path, {"version": "3.11", "machine": "aarch64", "glibc": "2.34"})
    [argv] = asked
    platforms = [argv[i + 1] for i, word in enumerate(argv) if word == "--platform"]
    assert platforms and all(p.endswith("_aarch64") for p in platforms), platforms
    assert "manylinux_2_34_aarch64" in platforms and "--python-version" in argv
