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
        "hpclaunch.discover",
        "hpclaunch.stage",
        "hpclaunch.slurmcmd",
        "hpclaunch.backends",
        "hpclaunch.containers",
        "hpclaunch.venvs",
        "hpclaunch.snapshot",
    }
    assert not (_imports("hpclaunch.config") & forbidden)
    stdlib: set[str] = set()
    for node in ast.walk(_tree("hpclaunch.config")):
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
    assert readers == {"hpclaunch.environ"}


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
    """Only hpclaunch/states.py spells a job state; other code names `State.X` (or
    `State.X.value` where a plain str is stored) and asks `is_active`, `is_open`,
    `is_streaming`, `exit_code_for` there.

    The rule: outside hpclaunch.states, no str constant of the code (ast.Constant, also a
    literal piece of an f-string; docstrings excepted) is a state's name (`State`, case as
    Slurm writes it: "CANCELLED", "CREATED", "UNKNOWN"), a squeue short code of two or
    more letters ("PD", "CA", "OOM"), or a comma list of those ("PENDING,RUNNING"). Text
    that holds a state among other words is prose (messages, help, comments in generated
    shell, "CANCELLED by 0") and passes, as do lower-case words ("pending") and the
    one-letter codes R, S, F (TypeVars, file modes). The in-job modules (hpclaunch.node)
    are checked too: none spells a state today; one that must keeps its copy in
    node/__init__.py, exempted here and compared with states.py by tests/test_node_package.py.
    """
    from hpclaunch.states import SLURM_STATES, State

    words = frozenset(s.value for s in State) | frozenset(
        row.short for row in SLURM_STATES if row.short is not None and len(row.short) > 1
    )
    found = []
    for name, path in MODULES.items():
        if name == "hpclaunch.states":
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
