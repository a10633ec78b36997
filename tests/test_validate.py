"""validate(): each error names the field the user gave, in the one-line format."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hpclaunch.basics import users
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.config.options import RunOptions
from hpclaunch.config.profiles import NodeShape, Profile, load_profile
from hpclaunch.errors import UserError
from hpclaunch.planning.validate import MAX_LOCAL_RANKS, validate

ENV = {"USER": "alice", "PATH": "/usr/bin:/bin"}
PROGRAM = ("python", "train.py")


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def _check(
    profile: Profile,
    values: Mapping[str, Any],
    sources: Mapping[str, str] | None = None,
    environ: Mapping[str, str] = ENV,
) -> JobSpec:
    given = {key: "cli" for key in values} if sources is None else sources
    return validate(profile, RunOptions(**values), given, PROGRAM, environ, False, "proj")


def _error(profile: Profile, values: Mapping[str, Any], **kw: Any) -> str:
    with pytest.raises(UserError) as info:
        _check(profile, values, **kw)
    text = info.value.line()
    assert "\n" not in text
    return text


def _lumi() -> Profile:
    return load_profile("lumi")


# -- local rank limit: -N or --tasks-per-node, whichever the user gave ------------------


def test_many_local_nodes_blame_nodes() -> None:
    assert _error(load_profile("local"), {"nodes": 1000}) == (
        "hpclaunch: error: --nodes: 1000 nodes x 1 task = 1000 local ranks "
        f"(at most {MAX_LOCAL_RANKS}). Use at most {MAX_LOCAL_RANKS} nodes locally, "
        "or fewer tasks per node"
    )


def test_many_local_tasks_blame_tasks_per_node() -> None:
    text = _error(load_profile("local"), {"tasks_per_node": 1000})
    assert text.startswith("hpclaunch: error: --tasks-per-node: 1 node x 1000 tasks = 1000 ")
    assert f"(at most {MAX_LOCAL_RANKS})" in text


def test_tasks_over_the_limit_on_one_node_blame_tasks_even_with_nodes() -> None:
    text = _error(load_profile("local"), {"nodes": 2, "tasks_per_node": 300})
    assert text.startswith("hpclaunch: error: --tasks-per-node: 2 nodes x 300 tasks")


def test_the_value_typed_now_is_blamed_over_the_project_file() -> None:
    local = load_profile("local")
    values = {"nodes": 64, "tasks_per_node": 8}
    text = _error(local, values, sources={"nodes": "project", "tasks_per_node": "cli"})
    assert text.startswith("hpclaunch: error: --tasks-per-node: 64 nodes x 8 tasks")
    text = _error(local, values, sources={"nodes": "cli", "tasks_per_node": "project"})
    assert text.startswith("hpclaunch: error: --nodes: 64 nodes x 8 tasks")


def test_local_ranks_at_the_limit_pass() -> None:
    spec = _check(load_profile("local"), {"nodes": 2, "tasks_per_node": MAX_LOCAL_RANKS // 2})
    assert spec.nodes * spec.tasks_per_node == MAX_LOCAL_RANKS


# -- CPUs per node: --tasks-per-node unless the user gave --cpus-per-task --------------


def test_huge_tasks_per_node_on_lumi_blame_tasks_per_node() -> None:
    values = {"account": "project_1", "tasks_per_node": 64}
    assert _error(_lumi(), values) == (
        "hpclaunch: error: --tasks-per-node: 64 tasks x 1 CPU = 64 per node "
        "(nodes have 56 usable cores). Use at most 56 tasks per node"
    )


def test_huge_tasks_per_node_on_a_slurm_profile() -> None:
    site = Profile(name="site", kind="slurm", node=NodeShape(cpus=16))
    text = _error(site, {"tasks_per_node": 1000})
    assert text.startswith("hpclaunch: error: --tasks-per-node: 1000 tasks x 1 CPU = 1000 ")
    assert "(nodes have 16 usable cores)" in text


def test_cpus_per_task_given_is_blamed() -> None:
    values = {"account": "project_1", "tasks_per_node": 8, "cpus_per_task": 8}
    assert _error(_lumi(), values) == (
        "hpclaunch: error: --cpus-per-task: 8 tasks x 8 CPUs = 64 per node "
        "(nodes have 56 usable cores). Use at most 7 CPUs per task or fewer tasks"
    )


def test_cpus_per_task_from_the_project_file_is_blamed_when_tasks_are_default() -> None:
    site = Profile(name="site", kind="slurm", node=NodeShape(cpus=16))
    text = _error(site, {"cpus_per_task": 32}, sources={"cpus_per_task": "project"})
    assert text.startswith("hpclaunch: error: --cpus-per-task: 1 task x 32 CPUs")


def test_torchrun_counts_cpus_the_same_way() -> None:
    values = {"account": "project_1", "tasks_per_node": 60, "launcher": "torchrun"}
    assert _error(_lumi(), values).startswith("hpclaunch: error: --tasks-per-node: 60 tasks")


# -- the other checks keep their fields ------------------------------------------------


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"nodes": 0}, "--nodes"),
        ({"nodes": 2000}, "--nodes"),
        ({"partition": "nope"}, "--partition"),
        ({"partition": "a b"}, "--partition"),
        ({"gpus_per_node": 9}, "--gpus-per-node"),
        ({"gpus_per_node": -1}, "--gpus-per-node"),
        ({"tasks_per_node": 0}, "--tasks-per-node"),
        ({"cpus_per_task": 0}, "--cpus-per-task"),
        ({"mem": 1024, "mem_per_gpu": 1024}, "--mem"),
        ({"mem": 600 * 1024}, "--mem"),
        ({"mem_per_gpu": 100 * 1024}, "--mem-per-gpu"),
        ({"partition": "dev-g", "time": 4 * 3600}, "--time"),
        ({"account": "myproj"}, "--account"),
        ({"account": ""}, "--account"),
        ({"job_name": "a\nb"}, "--job-name"),
        ({"job_name": "n" * 201}, "--job-name"),
        ({"job_name": 'say "hi"'}, "--job-name"),
        ({"exp": "../up"}, "--exp"),
        ({"setup": ("a\nb",)}, "--setup"),
        ({"reservation": "r s"}, "--reservation"),
        ({"env": ("NOEQ",)}, "--env"),
        ({"sbatch_arg": ("--nodes=3",)}, "--sbatch-arg"),
    ],
)
def test_each_check_names_its_field(values: dict[str, Any], field: str) -> None:
    full = {"account": "project_1", **values}
    assert _error(_lumi(), full).startswith(f"hpclaunch: error: {field}: ")


def test_missing_program() -> None:
    with pytest.raises(UserError, match=r"^PROGRAM: missing"):
        validate(_lumi(), RunOptions(account="project_1"), {}, (), ENV, False)


# -- run roots and the user name -------------------------------------------------------


def test_lumi_run_root_without_user_or_logname_uses_the_account_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(users, "_uid_name", lambda uid: "carol")
    spec = _check(_lumi(), {"account": "project_1"}, environ={"PATH": "/bin"})
    assert spec.run_root == "/scratch/project_1/carol/hpclaunch"
    assert spec.checkpoint_root == "/flash/project_1/carol/hpclaunch"


def test_lumi_run_root_prefers_user_then_logname() -> None:
    spec = _check(_lumi(), {"account": "project_1"}, environ={"LOGNAME": "dave"})
    assert spec.run_root == "/scratch/project_1/dave/hpclaunch"
    spec = _check(_lumi(), {"account": "project_1"}, environ={"USER": "u", "LOGNAME": "l"})
    assert spec.run_root == "/scratch/project_1/u/hpclaunch"


def test_run_root_given_wins() -> None:
    spec = _check(_lumi(), {"account": "project_1", "run_root": "/x"})
    assert spec.run_root == "/x"


def test_lumi_whole_node_defaults() -> None:
    spec = _check(_lumi(), {"account": "project_1"})
    assert (spec.gpus_per_node, spec.tasks_per_node, spec.cpus_per_task) == (8, 8, 7)
    assert spec.cpu_bind.startswith("verbose,mask_cpu:")
    assert _check(_lumi(), {"account": "project_1", "launcher": "torchrun"}).cpu_bind == ""
