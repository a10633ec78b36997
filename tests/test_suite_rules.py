"""Rules of the test suite itself: what lets scripts/test.sh run tests side by side.

scripts/test.sh runs every test not marked ``serial`` in parallel workers, several at a
time on the one testbed; a test that needs the cluster to itself must say so with
``@pytest.mark.serial`` (or its module's ``pytestmark``), or it fails, or breaks its
neighbours, only when the timing is unlucky.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent

#: What only a test with the cluster to itself may do: wait for every job to end, change
#: slurmctld's configuration, crash nodes, change a kernel setting for everyone.
WHOLE_CLUSTER = {
    "wait_idle",
    "first_job_id",
    "min_job_age",
    "node_crashes",
    "protected_symlinks_off",
}


def _is_serial_mark(node: ast.expr) -> bool:
    return "mark.serial" in ast.unparse(node)


def _serial_module(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return "mark.serial" in ast.unparse(node.value)
    return False


#: Reading everything of a kind in the host's /tmp (before/after comparisons): other
#: tests' runs put theirs there too.
HOST_TMP_LISTING = "Path('/tmp').glob"


def _calls(function: ast.FunctionDef) -> set[str]:
    names = {HOST_TMP_LISTING} if HOST_TMP_LISTING in ast.unparse(function) else set()
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
    return names


def unmarked_whole_cluster_tests() -> list[str]:
    """Tests (file::name: what they do) that use a whole-cluster helper, directly or
    through a helper function of their own module, without the ``serial`` mark."""
    found = []
    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        if _serial_module(tree):
            continue
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        shared = WHOLE_CLUSTER | {HOST_TMP_LISTING}
        direct = {name: _calls(f) & shared for name, f in functions.items()}
        for name, function in functions.items():
            if not name.startswith("test_"):
                continue
            used = set(direct[name])
            for called in _calls(function) & functions.keys():
                used |= direct[called]  # one level of the module's own helpers
            if used and not any(_is_serial_mark(d) for d in function.decorator_list):
                found.append(f"{path.name}::{name}: {', '.join(sorted(used))}")
    return found


def test_tests_that_need_the_whole_cluster_are_marked_serial() -> None:
    assert unmarked_whole_cluster_tests() == []
