"""The house's layers (docs/internals.md, "Layers"): every folder of src/hpclaunch and
every module of its top level has a place in one declared order, and imports only go
down it. A folder-level loop (records/ -> sweeps/ -> records/) is an import running up,
so none can form, which the module-level loop test (tests/test_layout.py) cannot see."""

from __future__ import annotations

import pytest

from test_layout import MODULES, _imports

# Bottom first. A unit is a folder (every module under it) or a top-level module; a unit
# may import itself and any unit of a lower layer, never one of its own layer or above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("node", "errors", "version"),  # shipped stdlib-only code; the exception tree
    ("basics",),  # environment, file modes, shell quoting, users, states, units
    ("config",),  # options, layers, profiles, project/user files, the JobSpec type
    ("slurm",),  # the one runner of Slurm commands, what Slurm says of itself
    ("records",),  # run folders' paths, run.json, the index, sweep.json, the resolver
    ("payload",),  # project facts, snapshot, staging, containers, venvs
    ("observe",),  # wait loop, logs, a job's end, GPU metrics, top, plot, stacks, attach
    ("script",),  # JobSpec -> job script
    ("backends",),  # the seam, slurm/step/local, one refresh of many runs
    ("planning",),  # request -> JobSpec (asks the chosen backend its questions)
    ("launching",),  # the orchestrator: plan -> run folder -> backend.start -> record
    ("sweeps",),  # many runs through the same launch path
    ("handle", "remote"),  # a run's handle here; the OpenSSH seam and the laptop's side
    ("doctor",),  # checks and the doctor's job (launched and watched like any run)
    ("sessions",),  # hpclaunch dev: an allocation held, a shell/server in it, the relay
    ("api",),  # the typed API
    ("calls",),  # hpclaunch.call/submit: a function on every rank, over the API's run path
    ("hpclaunch",),  # the package face (lazy exports)
    ("cli",),  # thin click commands over all of it
    ("__main__",),  # python -m hpclaunch
)
LEVEL = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    """hpclaunch.records.index -> records; hpclaunch.api -> api; hpclaunch -> hpclaunch."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports() -> list[str]:
    found = []
    for name in sorted(MODULES):
        unit = unit_of(name)
        for dep in sorted(_imports(name)):
            target = unit_of(dep)
            if target != unit and LEVEL[target] >= LEVEL[unit]:
                found.append(
                    f"{name} -> {dep} ({unit} at {LEVEL[unit]}, {target} at {LEVEL[target]})"
                )
    return found


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(name) for name in MODULES}
    assert units == set(LEVEL), "declare the new folder's layer in LAYERS"


def test_imports_only_go_down() -> None:
    found = upward_imports()
    assert not found, "imports running up a layer:\n" + "\n".join(found)


def test_remote_does_not_import_the_cli() -> None:
    found = [
        n for n in MODULES if unit_of(n) == "remote" for d in _imports(n) if unit_of(d) == "cli"
    ]
    assert not found


def test_nothing_imports_the_package_face() -> None:
    """__version__ comes from hpclaunch.version; the face only re-exports."""
    found = [n for n in MODULES if "hpclaunch" in _imports(n)]
    assert not found


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_holds_no_module_twice(layer: tuple[str, ...]) -> None:
    assert len(set(layer)) == len(layer)
