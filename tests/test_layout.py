"""The package's shape, read from its source: small modules and functions, no import
loop, config only layers, one reader of os.environ, no submodule shadowing the API, and
docs/internals.md naming every module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "hpclaunch"
INTERNALS = PACKAGE.parents[1] / "docs" / "internals.md"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
# Files that must ship as one piece may be longer if their docstring says why.
ONE_PIECE_MARK = "must stay one file"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_and_function_sizes(name: str) -> None:
    text = MODULES[name].read_text(encoding="utf-8")
    tree = ast.parse(text)
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        doc = ast.get_docstring(tree) or ""
        assert ONE_PIECE_MARK in doc, f"{name}: {lines} lines (over {MAX_MODULE_LINES})"
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, f"{name}.{node.name}: {length} lines"


def _imports(name: str) -> set[str]:
    """hpclaunch modules `name` imports anywhere (function-level imports included:
    a loop dodged inside a function is still a loop)."""
    is_package = MODULES[name].name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("hpclaunch"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                stem = ".".join(base[: len(base) - node.level + 1])
                module = f"{stem}.{node.module}" if node.module else stem
            else:
                module = node.module or ""
            if not module.startswith("hpclaunch"):
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in MODULES else module)
    return {m for m in found if m in MODULES and m != name}


def test_no_import_loop() -> None:
    graph = {name: _imports(name) for name in MODULES if name != "hpclaunch"}
    # A package's __init__ is imported before any of its submodules: an edge from a
    # submodule to its own package is not a loop through the package's code.
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                pytest.fail("import loop: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_config_only_layers() -> None:
    """config imports nothing that packs data, queries Slurm or runs a program."""
    forbidden = {
        "hpclaunch.slurm.discover",
        "hpclaunch.payload.stage",
        "hpclaunch.slurm.commands",
        "hpclaunch.backends",
        "hpclaunch.payload.containers",
        "hpclaunch.payload.venvs",
        "hpclaunch.payload.snapshot",
    }
    assert not (_imports("hpclaunch.config.layering") & forbidden)
    stdlib: set[str] = set()
    for node in ast.walk(_tree("hpclaunch.config.layering")):
        if isinstance(node, ast.Import):
            stdlib.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            stdlib.add(node.module or "")
    assert not stdlib & {"subprocess", "shutil", "tarfile"}


def _reads_environ(name: str) -> bool:
    for node in ast.walk(_tree(name)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            return True
    return False


def test_one_module_reads_the_environment() -> None:
    """environ.py reads os.environ once and the API hands the request's environment on;
    the code shipped into jobs (hpclaunch.node) reads its own task's environment."""
    readers = {
        name for name in MODULES if not name.startswith("hpclaunch.node") and _reads_environ(name)
    }
    assert readers == {"hpclaunch.basics.environ"}


def test_no_submodule_shadows_the_api() -> None:
    for name in ("run", "runs", "get", "call"):
        assert f"hpclaunch.{name}" not in MODULES


def _section(doc: str, heading: str) -> str:
    start = doc.index(heading)
    end = doc.find("\n## ", start + len(heading))
    return doc[start : end if end >= 0 else len(doc)]


def test_internals_names_every_module() -> None:
    """docs/internals.md's layout tree (and its section on the shipped node files) names
    every module by its file name, so a newcomer's map never misses a file."""
    doc = INTERNALS.read_text(encoding="utf-8")
    text = _section(doc, "## Layout") + _section(doc, "## Code that runs on the nodes")
    unnamed = [
        str(path.relative_to(PACKAGE))
        for path in MODULES.values()
        if not path.stem.startswith("__")
        and not re.search(rf"(?<![\w.]){re.escape(path.stem)}(?![\w])", text)
    ]
    assert not unnamed, f"docs/internals.md does not name: {', '.join(unnamed)}"


# -- nothing outside backends/ asks which backend it is --------------------------------

BACKEND_NAMES = frozenset({"local", "slurm", "step"})
# What names a backend, a profile's kind or a cluster when compared: `record.backend`,
# `profile.kind`, `backend.name`, `spec.cluster`, `data.get("backend")`, `data["kind"]`.
_NAMING_ATTRS = frozenset({"backend", "kind", "name", "cluster"})
_NAMING_VARS = frozenset({"backend", "kind", "cluster", "profile_kind", "backend_name"})


def _names_backend(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in _NAMING_ATTRS
    if isinstance(node, ast.Name):
        return node.id in _NAMING_VARS
    key: ast.expr | None = None
    if isinstance(node, ast.Subscript):
        key = node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        key = node.args[0] if node.func.attr == "get" and node.args else None
    return isinstance(key, ast.Constant) and key.value in ("backend", "kind", "cluster")


def _backend_names(node: ast.expr) -> set[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and i.value in BACKEND_NAMES}


def _asks_backend_class(call: ast.Call) -> bool:
    """isinstance(x, LocalBackend): which backend it is, asked by its class."""
    if not (isinstance(call.func, ast.Name) and call.func.id == "isinstance") or len(call.args) < 2:
        return False
    kinds = call.args[1].elts if isinstance(call.args[1], ast.Tuple) else [call.args[1]]
    named = [k.id if isinstance(k, ast.Name) else getattr(k, "attr", "") for k in kinds]
    return any(n.endswith("Backend") and n != "Backend" for n in named)


def backend_name_checks(source: str) -> list[int]:
    """The lines that compare or branch on a backend's name: `==`, `!=`, `in`, `not in`
    between what names a backend (above) and "local", "slurm" or "step"; `.startswith`
    of such a name; a `match` on it with such a case; `isinstance(x, LocalBackend)`.

    Cluster (profile) names are not backend names as data: `load_profile("local")`, the
    built-in profile list, `--cluster local` chosen as the default all pass. But a
    profile name compared to decide what a run does (`spec.cluster == "local"`) is a
    backend question in disguise (a user's own profile of the local kind has any name),
    so it is caught here like `profile.kind == "local"`: ask the chosen backend instead
    (backends.chosen/pick/of_record: runs_here, asks_sinfo, snapshots_by_default,
    step_of_allocation, foreground, cancel_recorded, dry_run)."""
    found: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_backend(s) for s in sides) and any(_backend_names(s) for s in sides):
                found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            prefix = node.func.attr in ("startswith", "endswith")
            if prefix and _names_backend(node.func.value) and any(map(_backend_names, node.args)):
                found.append(node.lineno)
        elif isinstance(node, ast.Call) and _asks_backend_class(node):
            found.append(node.lineno)
        elif isinstance(node, ast.Match) and _names_backend(node.subject):
            for case in node.cases:
                for sub in ast.walk(case.pattern):
                    if isinstance(sub, ast.MatchValue) and _backend_names(sub.value):
                        found.append(sub.lineno)
    return sorted(found)


def test_nothing_outside_backends_asks_which_backend_it_is() -> None:
    found: dict[str, list[int]] = {}
    for name, path in MODULES.items():
        if name.startswith("hpclaunch.backends"):
            continue
        lines = backend_name_checks(path.read_text(encoding="utf-8"))
        if lines:
            found[name] = lines
    assert found == {}, "ask the chosen backend (backends/__init__.py), not its name"


@pytest.mark.parametrize(
    "planted",
    [
        'if record.backend == "local":\n    pass\n',
        'x = profile.kind != "slurm"\n',
        'x = data.get("backend") in ("local", "step")\n',
        'x = spec.cluster == "local"\n',
        'x = started.backend.kind.startswith("step")\n',
        'match record.backend:\n    case "slurm":\n        pass\n',
        'x = "local" == backend.name\n',
        "x = isinstance(started.backend, (LocalBackend, StepBackend))\n",
    ],
)
def test_the_backend_name_rule_catches_a_planted_check(planted: str) -> None:
    assert backend_name_checks("import os\n" + planted) != []


@pytest.mark.parametrize(
    "fine",
    [
        'profile = load_profile("local")\n',
        'BUILTIN = ("local", "slurm", "lumi")\n',
        'x = spec.cluster == "lumi"\n',
        'x = record.state == "local"\n',
        'x = {"backend": "local" if here else "slurm"}\n',
    ],
)
def test_the_backend_name_rule_leaves_profile_names_as_data(fine: str) -> None:
    assert backend_name_checks(fine) == []


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the module's, classes' and functions' docstring nodes."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _spells_a_state(text: str, words: frozenset[str]) -> bool:
    return all(part in words for part in text.split(","))


def test_only_states_spells_a_state() -> None:
    """Only hpclaunch/basics/states.py spells a job state; other code names `State.X` (or
    `State.X.value` where a plain str is stored) and asks `is_active`, `is_open`,
    `is_streaming`, `exit_code_for` there.

    The rule: outside hpclaunch.basics.states, no str constant of the code (ast.Constant, also a
    literal piece of an f-string; docstrings excepted) is a state's name (`State`, case as
    Slurm writes it: "CANCELLED", "CREATED", "UNKNOWN"), a squeue short code of two or
    more letters ("PD", "CA", "OOM"), or a comma list of those ("PENDING,RUNNING"). Text
    that holds a state among other words is prose (messages, help, comments in generated
    shell, "CANCELLED by 0") and passes, as do lower-case words ("pending") and the
    one-letter codes R, S, F (TypeVars, file modes). The in-job modules (hpclaunch.node)
    are checked too: none spells a state today; one that must keeps its copy in
    node/__init__.py, exempted here and compared with states.py by tests/test_node_package.py.
    """
    from hpclaunch.basics.states import SLURM_STATES, State

    words = frozenset(s.value for s in State) | frozenset(
        row.short for row in SLURM_STATES if row.short is not None and len(row.short) > 1
    )
    found = []
    for name, path in MODULES.items():
        if name == "hpclaunch.basics.states":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and _spells_a_state(node.value, words)
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
    assert not found, "a state spelled outside states.py (use State.X):\n" + "\n".join(found)
