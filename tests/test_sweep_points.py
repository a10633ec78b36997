"""The points of a sweep (hpclaunch.sweeps.points): --grid, --configs, --repeat, their
refusals (one line each, naming file and line or entry) and the placeholder check."""

from __future__ import annotations

import json
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpclaunch.errors import UserError
from hpclaunch.node import RANK_PLACEHOLDERS, bootstrap
from hpclaunch.sweeps import points as sp
from hpclaunch.sweeps.points import (
    Point,
    build_points,
    check_placeholders,
    format_value,
    params_json,
    parse_grid,
    placeholder_names,
    read_configs,
)

LINE = re.compile(r"^hpclaunch: error: [^\n]+: [^\n]+\.[^\n]*\Z")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def refused(call: Callable[[], object], field: str, *words: str) -> UserError:
    """``call`` raises UserError for ``field``, rendered as one line holding ``words``."""
    with pytest.raises(UserError) as info:
        call()
    err = info.value
    assert err.field == field, err.line()
    assert LINE.match(err.line()), err.line()
    for word in words:
        assert word in err.line(), (word, err.line())
    return err


def grid_of(found: list[Point]) -> list[dict[str, object]]:
    return [dict(p.params) for p in found]


# --- constants shared with the bootstrap


def test_rank_placeholders_are_the_bootstraps() -> None:
    assert set(RANK_PLACEHOLDERS) == set(bootstrap.PLACEHOLDERS)
    assert len(RANK_PLACEHOLDERS) == len(set(RANK_PLACEHOLDERS))


# --- --grid


def test_parse_grid_keeps_values_as_typed() -> None:
    assert parse_grid("lr=0.1,0.01") == ("lr", ("0.1", "0.01"))
    # issue 29: the blank after a comma is no part of the value (it was " sgd")
    assert parse_grid("opt=adam, sgd") == ("opt", ("adam", "sgd"))
    assert parse_grid("x=1e-3,1E-3,001") == ("x", ("1e-3", "1E-3", "001"))
    assert parse_grid("flag=a=b") == ("flag", ("a=b",))
    assert parse_grid("_u8=ü") == ("_u8", ("ü",))


def test_grid_product_order_and_count() -> None:
    found = build_points(["a=1,2", "b=x,y,z"], None, None)
    assert [p.index for p in found] == list(range(6))
    assert grid_of(found) == [
        {"a": "1", "b": "x"},
        {"a": "1", "b": "y"},
        {"a": "1", "b": "z"},
        {"a": "2", "b": "x"},
        {"a": "2", "b": "y"},
        {"a": "2", "b": "z"},
    ]
    assert all(p.args == () and p.source == "" for p in found)
    assert len(build_points(["a=1,2,3", "b=1,2", "c=1,2,3,4,5"], None, None)) == 30


def test_repeat_is_innermost_seed() -> None:
    found = build_points(["lr=0.1,0.2"], None, 3)
    assert grid_of(found) == [
        {"lr": lr, "seed": seed} for lr in ("0.1", "0.2") for seed in range(3)
    ]
    assert isinstance(found[0].params["seed"], int)


def test_repeat_alone() -> None:
    found = build_points([], None, 4)
    assert grid_of(found) == [{"seed": s} for s in range(4)]
    assert found[2].env() == {"HPCLAUNCH_PARAM_SEED": "2"}
    assert len(build_points([], None, 1)) == 1


# --- --configs


TXT = """\
# a comment, then a blank line

--lr 0.1 --name "two words"
   # an indented comment
--cmd 'echo $HOME; rm -rf /' `ls` $(whoami) ; a&&b |c >out
  --text "it's \\"quoted\\"" --uni 日本語 ünï --dollar '$' --tab "a\tb"
--empty '' --hash '#not a comment' x#y
"""


def test_txt_configs_exact_words(tmp_path: Path) -> None:
    path = write(tmp_path, "exp.txt", TXT)
    configs = read_configs(path)
    assert configs == [
        ({}, ("--lr", "0.1", "--name", "two words"), "exp.txt:3"),
        (
            {},
            ("--cmd", "echo $HOME; rm -rf /", "`ls`", "$(whoami)", ";", "a&&b", "|c", ">out"),
            "exp.txt:5",
        ),
        (
            {},
            (
                "--text",
                'it\'s "quoted"',
                "--uni",
                "日本語",
                "ünï",
                "--dollar",
                "$",
                "--tab",
                "a\tb",
            ),
            "exp.txt:6",
        ),
        ({}, ("--empty", "", "--hash", "#not a comment", "x#y"), "exp.txt:7"),
    ]
    found = build_points([], path, None)
    assert [p.args for p in found] == [c[1] for c in configs]
    assert all(p.params == {} for p in found)
    assert found[0].label() == "--lr 0.1 --name 'two words'"
    assert found[0].env() == {}


def test_txt_crlf_and_bom(tmp_path: Path) -> None:
    path = tmp_path / "w.txt"
    path.write_bytes(b"\xef\xbb\xbf--a 1\r\n\r\n--b 'x y'\r\n")
    assert read_configs(path) == [({}, ("--a", "1"), "w.txt:1"), ({}, ("--b", "x y"), "w.txt:3")]


def test_json_configs(tmp_path: Path) -> None:
    data = [{"lr": 0.1, "opt": "adam", "warm": True, "steps": 100}, {"lr": 1e-3, "opt": "sgd"}]
    path = write(tmp_path, "c.json", json.dumps(data, indent=2))
    assert read_configs(path) == [
        (data[0], (), "c.json entry 1"),
        (data[1], (), "c.json entry 2"),
    ]
    found = build_points([], path, None)
    assert list(found[0].params) == ["lr", "opt", "warm", "steps"]
    assert found[0].env() == {
        "HPCLAUNCH_PARAM_LR": "0.1",
        "HPCLAUNCH_PARAM_OPT": "adam",
        "HPCLAUNCH_PARAM_WARM": "true",
        "HPCLAUNCH_PARAM_STEPS": "100",
    }
    assert found[1].label() == "lr=0.001 opt=sgd"


def test_jsonl_configs(tmp_path: Path) -> None:
    path = write(tmp_path, "c.jsonl", '{"lr": 0.1}\n\n  \n{"lr": 0.2, "tag": "b c"}\n')
    assert read_configs(path) == [
        ({"lr": 0.1}, (), "c.jsonl:1"),
        ({"lr": 0.2, "tag": "b c"}, (), "c.jsonl:4"),
    ]
    assert build_points([], path, None)[1].label() == "lr=0.2 'tag=b c'"


def test_toml_configs(tmp_path: Path) -> None:
    text = '# sweep\n[[points]]\nlr = 0.1\nopt = "adam"\n\n[[points]]\nlr = 1\nwarm = false\n'
    path = write(tmp_path, "c.toml", text)
    assert read_configs(path) == [
        ({"lr": 0.1, "opt": "adam"}, (), "c.toml entry 1"),
        ({"lr": 1, "warm": False}, (), "c.toml entry 2"),
    ]


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_yaml_configs(tmp_path: Path, suffix: str) -> None:
    pytest.importorskip("yaml")  # an optional dependency
    path = write(tmp_path, "c" + suffix, "# sweep\n- lr: 0.1\n  opt: adam\n- {lr: 2, warm: yes}\n")
    assert read_configs(path) == [
        ({"lr": 0.1, "opt": "adam"}, (), f"c{suffix} entry 1"),
        ({"lr": 2, "warm": True}, (), f"c{suffix} entry 2"),
    ]


def test_yaml_without_pyyaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "c.yaml", "- lr: 1\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml -> ImportError
    err = refused(lambda: read_configs(path), "--configs", "PyYAML is not installed")
    assert err.problem == f"{path} is YAML, and PyYAML is not installed"
    assert err.fix == "pip install 'hpclaunch[yaml]'"


def test_suffix_is_case_blind(tmp_path: Path) -> None:
    path = write(tmp_path, "C.JSON", '[{"a": 1}]')
    assert read_configs(path) == [({"a": 1}, (), "C.JSON entry 1")]


def test_configs_crossed_with_grid_and_repeat(tmp_path: Path) -> None:
    path = write(tmp_path, "c.jsonl", '{"opt": "adam"}\n{"opt": "sgd", "mom": 0.9}\n')
    found = build_points(["lr=1,2"], path, 2)
    assert grid_of(found) == [
        {"opt": "adam", "lr": "1", "seed": 0},
        {"opt": "adam", "lr": "1", "seed": 1},
        {"opt": "adam", "lr": "2", "seed": 0},
        {"opt": "adam", "lr": "2", "seed": 1},
        {"opt": "sgd", "mom": 0.9, "lr": "1", "seed": 0},
        {"opt": "sgd", "mom": 0.9, "lr": "1", "seed": 1},
        {"opt": "sgd", "mom": 0.9, "lr": "2", "seed": 0},
        {"opt": "sgd", "mom": 0.9, "lr": "2", "seed": 1},
    ]
    assert [p.source for p in found] == ["c.jsonl:1"] * 4 + ["c.jsonl:2"] * 4
    assert [p.index for p in found] == list(range(8))


def test_txt_configs_crossed_with_grid(tmp_path: Path) -> None:
    path = write(tmp_path, "e.txt", "--model a\n--model 'b c'\n")
    found = build_points(["lr=1,2"], path, None)
    assert [(p.args, dict(p.params)) for p in found] == [
        (("--model", "a"), {"lr": "1"}),
        (("--model", "a"), {"lr": "2"}),
        (("--model", "b c"), {"lr": "1"}),
        (("--model", "b c"), {"lr": "2"}),
    ]
    assert found[3].label() == "--model 'b c' lr=2"


# --- values


def test_format_value() -> None:
    assert format_value("0.10") == "0.10"
    assert format_value("") == ""
    assert format_value(True) == "true"
    assert format_value(False) == "false"
    assert format_value(3) == "3"
    assert format_value(-0) == "0"
    assert format_value(0.1) == "0.1"
    assert format_value(1e-5) == "1e-05"
    assert format_value(2.0) == "2.0"
    assert format_value(10**20) == "100000000000000000000"


def test_params_json_and_label() -> None:
    point = Point(0, {"lr": 0.1, "name": "日本", "on": True, "n": 2, "s": "a b"})
    assert params_json(point) == '{"lr":0.1,"name":"日本","on":true,"n":2,"s":"a b"}'
    assert point.label() == "lr=0.1 'name=日本' on=true n=2 's=a b'"
    assert Point(0, {"t": "a\nb"}).label() == "'t=a\\nb'"
    assert Point(0, {}).label() == "-"


# --- refusals


@pytest.mark.parametrize(
    ("grids", "field", "words"),
    [
        (["lr"], "--grid", ("'lr' has no '='",)),
        (["lr="], "--grid", ("'lr=' has no values",)),
        (["lr=1,,2"], "--grid", ("empty value",)),
        (["lr=1,"], "--grid", ("empty value",)),
        (["lr=1,2,1"], "--grid", ("'1' twice",)),
        (["=1"], "--grid", ("'' is not an identifier",)),
        (["1lr=1"], "--grid", ("'1lr' is not an identifier",)),
        (["learning-rate=1"], "--grid", ("'learning-rate' is not an identifier",)),
        (["lérn=1"], "--grid", ("'lérn' is not an identifier",)),
        (["a\nb=1"], "--grid", ("is not an identifier",)),
        (["rank=1,2"], "--grid", ("'rank' is named like a rank placeholder",)),
        (["MASTER_PORT=1"], "--grid", ("rank placeholder",)),
        (["lr=1", "lr=2"], "--grid", ("lr is given twice",)),
        (["lr=1", "LR=2"], "--grid", ("differ only by case", "HPCLAUNCH_PARAM_LR")),
        (["a=1\0"], "--grid", ("NUL",)),
    ],
)
def test_grid_refusals(grids: list[str], field: str, words: tuple[str, ...]) -> None:
    refused(lambda: build_points(grids, None, None), field, *words)


def test_nothing_to_sweep() -> None:
    err = refused(lambda: build_points([], None, None), "sweep", "nothing to sweep over")
    assert err.fix == "Give --grid NAME=V1,V2, --configs FILE, --repeat N or --optuna SPACE"


@pytest.mark.parametrize("repeat", [0, -1])
def test_repeat_below_one(repeat: int) -> None:
    refused(lambda: build_points(["a=1"], None, repeat), "--repeat", "below 1")


def test_seed_and_repeat(tmp_path: Path) -> None:
    refused(lambda: build_points(["seed=1,2"], None, 2), "--repeat", "seed is set by --grid")
    path = write(tmp_path, "c.json", '[{"seed": 1}]')
    refused(lambda: build_points([], path, 2), "--repeat", "seed is set by c.json entry 1")
    refused(lambda: build_points(["Seed=1"], None, 2), "--repeat", "Seed is set by --grid")
    assert grid_of(build_points(["seed=1,2"], None, None)) == [{"seed": "1"}, {"seed": "2"}]


def test_too_many_points_is_instant() -> None:
    grids = [f"p{i}=" + ",".join(map(str, range(1000))) for i in range(3)]
    start = time.perf_counter()
    err = refused(
        lambda: build_points(grids, None, None, max_points=10000), "sweep", "1000000000 points"
    )
    assert time.perf_counter() - start < 0.5
    assert err.limit == "at most 10000"
    assert len(build_points(["a=1,2"], None, 5, max_points=10)) == 10
    refused(lambda: build_points(["a=1,2"], None, 6, max_points=10), "sweep", "12 points")


def test_building_a_thousand_points_is_fast() -> None:
    grids = ["a=" + ",".join(map(str, range(10))), "b=" + ",".join(map(str, range(100)))]
    build_points(grids, None, None)  # warm up
    start = time.perf_counter()
    found = build_points(grids, None, None)
    check_placeholders(["--a={a}", "--b={b}", "{rank}"], found)
    assert len(found) == 1000
    # A few ms here; the bound only catches per-point work gone quadratic (seconds), as a
    # loaded CI machine took 0.28 s once: figures live in bench/sweep.py, not in tests.
    assert time.perf_counter() - start < 2


def test_config_and_grid_conflicts(tmp_path: Path) -> None:
    path = write(tmp_path, "c.jsonl", '{"a": 1}\n{"lr": 1}\n')
    refused(
        lambda: build_points(["lr=1"], path, None), "--grid", "lr is set by --grid and by c.jsonl:2"
    )
    refused(
        lambda: build_points(["LR=1"], path, None), "--grid", "differ only by case", "c.jsonl:2"
    )
    path = write(tmp_path, "d.jsonl", '{"lr": 1}\n{"Lr": 1}\n')
    refused(lambda: build_points([], path, None), "--configs", "Lr (d.jsonl:2) and lr (d.jsonl:1)")


BAD_FILES: list[tuple[str, str, tuple[str, ...]]] = [
    ("empty.txt", "", ("empty.txt holds no configuration",)),
    ("comments.txt", "# one\n\n   # two\n", ("holds no configuration",)),
    ("quote.txt", "--a 1\n\n--b 'open\n", ("quote.txt:3: No closing quotation",)),
    ("escape.txt", "--a 1\n--b x\\\n", ("escape.txt:2: No escaped character",)),
    ("nul.txt", "--a x\0y\n", ("nul.txt:1", "NUL")),
    ("data.csv", "a,b\n", ("unknown suffix '.csv'", ".txt, .json, .jsonl, .toml, .yaml, .yml")),
    ("noext", "x\n", ("unknown suffix ''",)),
    ("empty.json", "  \n", ("holds no configuration",)),
    ("list.json", "[]", ("holds no configuration",)),
    ("bad.json", '[\n{"a": 1},\n{"a": }\n]', ("bad.json:3: not valid JSON",)),
    ("top.json", '{"a": 1}', ("top.json: it is a mapping, not a list of mappings",)),
    ("null.json", "null", ("it is null",)),
    ("entry.json", '[{"a": 1}, [1]]', ("entry.json entry 2 is a list, not a mapping",)),
    ("nested.json", '[{"a": {"b": 1}}]', ("nested.json entry 1: a is a mapping",)),
    (
        "nullvalue.json",
        '[{"a": null}]',
        ("entry 1: a is null", "string, integer, float or boolean"),
    ),
    ("listvalue.json", '[{"a": [1, 2]}]', ("entry 1: a is a list",)),
    ("twice.json", '[{"a": 1}, {"b": 1, "b": 2}]', ("twice.json entry 2 sets b twice",)),
    ("name.json", '[{"a b": 1}]', ("name.json entry 1: name 'a b' is not an identifier",)),
    ("rank.json", '[{"local_rank": 1}]', ("entry 1: 'local_rank' is named like a rank",)),
    ("nul.json", '[{"a": "x\\u0000"}]', ("entry 1: a holds a NUL",)),
    ("blank.jsonl", "\n \n", ("holds no configuration",)),
    ("bad.jsonl", '{"a": 1}\n\n{"a": 1\n', ("bad.jsonl:3: not valid JSON",)),
    ("entry.jsonl", '{"a": 1}\n"x"\n', ("entry.jsonl:2 is a str, not a mapping",)),
    ("empty.toml", "# nothing\n", ("holds no configuration",)),
    ("twice.toml", "[[points]]\na = 1\na = 2\n", ("twice.toml is not valid TOML", "line 3")),
    ("array.toml", "[[points]]\na = [1, 2]\n", ("array.toml entry 1: a is a list",)),
    ("top.toml", "lr = 1\n[[points]]\na = 1\n", ("unknown top-level key 'lr'",)),
    ("table.toml", "[points]\na = 1\n", ("points is a mapping, not a list of mappings",)),
    ("date.toml", "[[points]]\nd = 2024-01-01\n", ("entry 1: d is a date",)),
    ("empty.yaml", "# nothing\n", ("holds no configuration",)),
    ("twice.yaml", "- a: 1\n- b: 1\n  b: 2\n", ("twice.yaml:3: entry 2 sets b twice",)),
    ("date.yaml", "- d: 2024-01-01\n", ("date.yaml entry 1: d is a date",)),
    ("syntax.yaml", "- a: 1\n- b: [1\n", ("syntax.yaml:", "not valid YAML")),
    ("top.yaml", "a: 1\n", ("top.yaml: it is a mapping",)),
    ("intkey.yaml", "- 1: a\n", ("name 1 is not an identifier",)),
    ("twodocs.yaml", "- a: 1\n---\n- a: 2\n", ("not valid YAML",)),
]


@pytest.mark.parametrize(("name", "text", "words"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_configs_refusals(tmp_path: Path, name: str, text: str, words: tuple[str, ...]) -> None:
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")  # an optional dependency
    path = write(tmp_path, name, text)
    refused(lambda: build_points([], path, None), "--configs", str(tmp_path), *words)


def test_unreadable_configs(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    refused(lambda: read_configs(missing), "--configs", f"cannot read {missing}", "No such file")
    folder = tmp_path / "dir.txt"
    folder.mkdir()
    refused(lambda: read_configs(folder), "--configs", f"cannot read {folder}")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"--name caf\xe9\n")
    refused(lambda: read_configs(latin), "--configs", "latin.txt is not UTF-8 (byte 10)")


# --- placeholders


def test_placeholder_names() -> None:
    assert placeholder_names("--lr={lr} --b={b}") == ["lr", "b"]
    assert placeholder_names("{{lr}}") == []
    assert placeholder_names("{{lr}") == ["lr"]  # no escape: "{" then {lr}
    assert placeholder_names('{"a": 1, "b": {"c": 2}}') == []
    assert placeholder_names("{} {1x} {a b} {é} { lr }") == []
    assert placeholder_names("{rank}-{x}") == ["rank", "x"]
    assert placeholder_names("{{{x}}}") == []  # "{" + {{x}} + "}"
    assert placeholder_names("a{") == placeholder_names("}{") == []


def test_placeholders_known_pass() -> None:
    found = build_points(["lr=1,2"], None, 2)
    check_placeholders(
        [
            "train.py",
            "--lr={lr}",
            "--seed={seed}",
            "--rank={rank}:{local_rank}/{world_size}",
            "--addr={master_addr}:{master_port}:{node_rank}:{local_world_size}",
            "--literal={{x}}",
            '--json={"a": 1}',
            "{}",
            "{1x}",
        ],
        found,
    )


def test_placeholder_unknown_everywhere() -> None:
    found = build_points(["lr=1,2"], None, None)
    err = refused(
        lambda: check_placeholders(["--x={x}"], found), "PROGRAM", "unknown placeholder {x}"
    )
    assert err.problem == "unknown placeholder {x} in argument '--x={x}'"
    assert err.limit == "known: " + ", ".join(sorted([*RANK_PLACEHOLDERS, "lr"]))
    assert err.fix == "Write {{x}} for a literal {x}"
    assert err.line().endswith(". Write {{x}} for a literal {x}")


def test_placeholder_case_matters() -> None:
    found = build_points(["lr=1"], None, None)
    refused(lambda: check_placeholders(["{LR}"], found), "PROGRAM", "{LR}")
    refused(lambda: check_placeholders(["{RANK}"], found), "PROGRAM", "{RANK}")


def test_placeholder_missing_in_one_config(tmp_path: Path) -> None:
    path = write(tmp_path, "c.jsonl", '{"lr": 0.1}\n{"opt": "sgd"}\n')
    found = build_points(["b=1,2"], path, None)
    err = refused(lambda: check_placeholders(["--lr={lr}"], found), "PROGRAM", "{lr}")
    assert err.problem == "unknown placeholder {lr} in argument '--lr={lr}' for point 2 (c.jsonl:2)"
    assert err.limit == "known: " + ", ".join(sorted([*RANK_PLACEHOLDERS, "b", "opt"]))
    check_placeholders(["--b={b}", "{{lr}}"], found)


def test_placeholder_in_point_args(tmp_path: Path) -> None:
    path = write(tmp_path, "e.txt", "--lr {lr} --r {rank}\n--x '{{y}}' '{\"j\": 1}'\n")
    check_placeholders(["{lr}"], build_points(["lr=1,2"], path, None))
    path = write(tmp_path, "f.txt", "--lr {lr}\n--x {nope}\n")
    found = build_points(["lr=1"], path, None)
    err = refused(lambda: check_placeholders([], found), "PROGRAM", "{nope}")
    assert err.problem == "unknown placeholder {nope} in argument '{nope}' of point 1 (f.txt:2)"


def test_check_placeholders_without_params() -> None:
    check_placeholders(["{rank}", "plain"], [Point(0, {})])
    refused(lambda: check_placeholders(["{a}"], [Point(0, {})]), "PROGRAM", "{a}")


# --- properties

WORD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\0"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(WORD, min_size=1, max_size=5), min_size=1, max_size=5))
def test_txt_lines_written_with_shlex_join_round_trip(lines: list[list[str]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "p.txt"
        path.write_text("".join(shlex.join(words) + "\n" for words in lines), encoding="utf-8")
        assert [args for _, args, _ in read_configs(path)] == [tuple(w) for w in lines]


@settings(max_examples=60, deadline=None)
@given(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True).filter(
        lambda n: n.lower() not in RANK_PLACEHOLDERS
    ),
    st.lists(  # values as parse_grid keeps them: the blanks around each are dropped
        st.text(st.characters(blacklist_characters=",\0"), min_size=1).map(str.strip).filter(bool),
        min_size=1,
        unique=True,
    ),
)
def test_grid_values_round_trip(name: str, values: list[str]) -> None:
    assert parse_grid(f"{name}={','.join(values)}") == (name, tuple(values))
    assert parse_grid(f"{name}= {' , '.join(values)} ") == (name, tuple(values))
    found = build_points([f"{name}={','.join(values)}"], None, None)
    assert [p.env()[sp.PARAM_ENV_PREFIX + name.upper()] for p in found] == values
