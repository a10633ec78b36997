"""The testbed's job_submit.lua (testbed/up.sh), run here by the Lua 5.1 library Slurm's
job_submit_lua plugin links (liblua5.1, present wherever Debian's slurm-wlm-basic-plugins
is): each site-like rule of partition "site" rejects what it should, in its words, and
lets everything else through. tests/test_e2e_site_rules.py submits real jobs to it."""

from __future__ import annotations

import ctypes
import ctypes.util
import re
from pathlib import Path

import pytest

UP_SH = Path(__file__).resolve().parents[1] / "testbed" / "up.sh"
NO_VAL16 = 65534


def filter_text() -> str:
    text = UP_SH.read_text(encoding="utf-8")
    found = re.search(r"<<'LUA'\n(.*?)\nLUA\n", text, re.S)
    assert found, "testbed/up.sh writes no job_submit.lua"
    return found.group(1)


def _lua() -> ctypes.CDLL:
    name = ctypes.util.find_library("lua5.1") or "liblua5.1.so.0"
    try:
        return ctypes.CDLL(name)
    except OSError:
        pytest.skip(
            "liblua5.1 is not installed (Debian: liblua5.1-0, a dependency of Slurm's plugins)"
        )


def submit(job: str) -> tuple[int, str]:
    """slurm_job_submit(JOB) in a fresh Lua state: (its return code, what it told the user)."""
    lua = _lua()
    lua.luaL_newstate.restype = ctypes.c_void_p
    state = ctypes.c_void_p(lua.luaL_newstate())
    lua.luaL_openlibs(state)
    harness = (
        "slurm = {SUCCESS = 0, ERROR = -1, said = ''}\n"
        "function slurm.log_user(text) slurm.said = text end\n"
        + filter_text()
        + f"\nlocal rc = slurm_job_submit({job}, {{}}, 1000)\n"
        "return tostring(rc) .. '|' .. slurm.said\n"
    )
    lua.luaL_loadstring.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    assert lua.luaL_loadstring(state, harness.encode()) == 0
    lua.lua_pcall.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    failed = lua.lua_pcall(state, 0, 1, 0)
    lua.lua_tolstring.restype = ctypes.c_char_p
    lua.lua_tolstring.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    answer = lua.lua_tolstring(state, -1, None).decode()
    lua.lua_close.argtypes = [ctypes.c_void_p]
    lua.lua_close(state)
    assert failed == 0, answer
    rc, _, said = answer.partition("|")
    return int(rc), said


def job(partition: str = "site", script: str = "#SBATCH --gres=gpu:1\n", qos: str = "normal",
        gpus: int = 1, cpus: int = 2, tasks: int = 1) -> str:  # fmt: skip
    tres = f'"gres:gpu:{gpus}"' if gpus else "nil"
    fields = (
        f'partition = "{partition}", script = [[{script}]], qos = "{qos}", '
        f"tres_per_node = {tres}, cpus_per_task = {cpus}, ntasks_per_node = {tasks}"
    )
    return "{" + fields + "}"


def test_a_job_as_the_site_wants_passes() -> None:
    assert submit(job()) == (0, "")
    assert submit(job(gpus=2, cpus=2, tasks=2)) == (0, "")
    assert submit(job(gpus=0, cpus=NO_VAL16, tasks=NO_VAL16)) == (0, "")


def test_other_partitions_are_left_alone() -> None:
    bare = job(partition="debug", script="#SBATCH --gpus-per-node=2\n", qos="", cpus=1)
    assert submit(bare) == (0, "")


def test_gpus_per_node_is_refused_where_the_site_wants_gres() -> None:
    rc, said = submit(job(script="#!/bin/bash\n#SBATCH --gpus-per-node=1\n"))
    assert rc != 0 and said.startswith("site rule: request GPUs with --gres=gpu:N")


def test_a_job_without_a_qos_is_refused() -> None:
    rc, said = submit(job(qos=""))
    assert rc != 0 and "must name a QoS" in said


def test_fewer_than_two_cpus_per_gpu_are_refused() -> None:
    rc, said = submit(job(gpus=2, cpus=1, tasks=2))
    assert rc != 0 and said == "site rule: at least 2 CPUs per GPU on partition site"
    rc, _ = submit(job(gpus=1, cpus=NO_VAL16, tasks=NO_VAL16))  # unset: 1 CPU
    assert rc != 0
