"""Profile validation: data whose values already have their fields' exact types skips
pydantic, and every other input gets exactly what pydantic alone gives (value or error)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Literal, Union

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hpclaunch.config import datarecords, profiles
from hpclaunch.config.profiles import (
    ContainerBind,
    ContainerSettings,
    NodeShape,
    Partition,
    Profile,
    load_profile,
)
from hpclaunch.errors import UserError

SRC = Path(profiles.__file__).resolve().parents[1]
RECORDS = (Partition, NodeShape, ContainerBind, ContainerSettings, Profile)


def _pydantic_only(cls: type[Any], data: Any) -> Any:
    return datarecords._from_model(datarecords._model(cls).model_validate(data))


def _outcome(validate: Any, cls: type[Any], data: Any) -> tuple[str, Any]:
    try:
        return ("ok", validate(cls, data))
    except UserError as exc:
        return ("user error", str(exc))
    except ValidationError as exc:
        return ("invalid", [(e["loc"], e["msg"], e["type"]) for e in exc.errors()])


def test_builtin_profiles_skip_pydantic_and_equal_its_result() -> None:
    for name in profiles.BUILTIN:
        data = {"name": name, **profiles._builtin(name)}
        fast = datarecords._build(Profile, data)  # raises _Decline if pydantic were needed
        assert fast == _pydantic_only(Profile, data) == load_profile(name)


def test_slurm_profile_and_discovered_partitions_never_import_pydantic() -> None:
    code = (
        "import sys; from hpclaunch.config import profiles as p; p.load_profile('slurm'); "
        "p.load_profile('local'); p.Partition.model_validate({'nodes': 2, 'max_time': 3600, "
        "'cpus': 8, 'gpus': 0, 'memory_mb': 1000, 'default': True}); "
        "assert 'pydantic' not in sys.modules, 'pydantic imported'"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "XDG_CONFIG_HOME": "/nonexistent"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"nodez": 2}, "cluster profile x: nodez: Extra inputs are not permitted"),
        ({"kind": "moon"}, "cluster profile x: kind: Input should be 'local' or 'slurm'"),
        ({"node": {"memory_mb": 5}}, "cluster profile x: node.memory_mb: Extra inputs are"),
        ({"node": 5}, "node: Input should be a valid dictionary or instance of NodeShape"),
        ({"node": {"gpus": "x"}}, "node.gpus: Input should be a valid integer, unable to parse"),
        ({"container": {"binds": [{"dst": "/x"}]}}, "container.binds.0.path: Field required"),
        ({"partitions": {"p": {"max_nodes": 1.5}}}, "partitions.p.max_nodes: Input should be"),
        ({"node": {"memory": "lots"}}, "node.memory: 'lots' is not a memory size"),
        ({"partitions": {"p": {"max_time": "soon"}}}, "max_time: 'soon' is not a time"),
    ],
)
def test_profile_errors_are_pydantics(table: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError) as info:
        load_profile("x", {"x": {"kind": "local", **table}})
    assert message in str(info.value)


def test_coercions_are_pydantics_and_records_act_as_before() -> None:
    part = Partition.model_validate({"max_nodes": "4", "whole_node": 1, "max_time": "1:00:00"})
    assert (part.max_nodes, part.whole_node, part.max_time) == (4, True, 3600)
    lumi = load_profile("lumi")
    assert Profile.model_validate(lumi) is lumi
    assert lumi.model_copy(update={"cluster_name": "lumi"}).cluster_name == "lumi"
    assert lumi.node.memory_mb == 480 * 1024 and lumi.partitions["dev-g"].max_time == 3 * 3600
    assert ContainerBind(path="/pfs", node_local=True, when_under=("/scratch", "/flash", "/pfs"))
    assert lumi.topology is not None and lumi.topology.gpus == 8
    site = Profile(name="site", node=NodeShape(cpus=16))
    assert site.node.cpus == 16 and site.container == ContainerSettings()


# --- the property: fast path or not, the outcome is pydantic's ---------------------------

ODD = st.sampled_from(
    [None, True, 0, 1, -3, 1.5, "", "x", "3", "60G", "1:00:00", [], ["a"], [1], {}, {"a": 1}]
)


def _of(tp: Any, depth: int) -> st.SearchStrategy[Any]:
    """Values plainly of type `tp`, sometimes an odd one instead."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is datarecords._Topology:
        plain: st.SearchStrategy[Any] = st.fixed_dictionaries(
            {}, optional={"numa_of_gpu": st.lists(st.integers(0, 3)), "ccd_size": st.integers()}
        )
    elif tp in (str, bool, int):
        plain = st.from_type(tp)
    elif origin is Union:
        plain = st.none() | _of(args[0], depth)
    elif origin is Literal:
        plain = st.sampled_from(args)
    elif origin is tuple:
        plain = st.lists(_of(args[0], depth), max_size=3)
    elif origin is dict:
        plain = st.dictionaries(st.text(max_size=3), _of(args[1], depth), max_size=2)
    else:  # a record
        plain = _table(tp, depth + 1) if depth < 2 else st.just({})
    return plain | ODD if depth < 3 else plain


def _table(cls: type[Any], depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for spec, key, tp in datarecords._specs(cls):
        missing = dataclasses.MISSING
        has_default = spec.default is not missing or spec.default_factory is not missing
        (optional if has_default else required)[key] = _of(tp, depth)
    optional["bogus"] = ODD
    if cls is NodeShape:
        optional.update(memory=st.sampled_from(["60G", "500M", "lots"]), memory_mb=ODD)
    if cls is Partition:
        optional["max_time"] = st.sampled_from(["2-00:00:00", "30", "0", "never"]) | ODD
    return st.fixed_dictionaries(required, optional=optional)


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_input_gets_pydantics_outcome(cls: type[Any], data: st.DataObject) -> None:
    table = data.draw(_table(cls))
    got = _outcome(datarecords._validate, cls, table)
    assert got == _outcome(_pydantic_only, cls, table)
