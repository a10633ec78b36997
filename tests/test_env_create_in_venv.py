"""`hpclaunch env create` without --container, run from inside a venv (issue #28 item 4):
a venv made from a venv sees the BASE interpreter's packages, so only those are pinned
(before: the outer venv's torch was pinned but not importable), and the command says
which interpreter it used. Real processes: a real outer venv, a real `env create`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import hpclaunch


def _outer_venv(tmp: Path) -> Path:
    outer = tmp / "outer"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(outer)], check=True)
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    meta = outer / "lib" / version / "site-packages" / "outeronly-1.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: outeronly\nVersion: 1.0\n")
    (meta / "RECORD").write_text("")
    return outer


def test_env_create_in_a_venv_pins_only_what_the_base_interpreter_has(tmp_path: Path) -> None:
    outer = _outer_venv(tmp_path)
    new = tmp_path / "new"
    environ = {
        "PATH": f"{outer / 'bin'}:/usr/bin:/bin",
        "VIRTUAL_ENV": str(outer),
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PIP_NO_INDEX": "1",
        "PYTHONPATH": str(Path(hpclaunch.__file__).parents[1]),  # the hpclaunch under test
    }
    done = subprocess.run(
        [sys.executable, "-m", "hpclaunch", "env", "create", "--cluster", "local", str(new)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    pins = (new / "hpclaunch-constraints.txt").read_text()
    assert "outeronly" not in pins  # the new venv cannot import it: not pinned
    record = json.loads((new / "hpclaunch-venv.json").read_text())
    base = record["interpreter"]
    assert not base.startswith(str(outer)) and os.path.isfile(base)
    assert f"hpclaunch: making the venv with {base} (Python " in done.stderr
    assert f"{outer}, whose own packages a new venv cannot see: not pinned" in done.stderr
    # every pin is a package the new venv sees
    seen = subprocess.run(
        [
            str(new / "bin" / "python"),
            "-c",
            "import importlib.metadata as m, json;"
            "print(json.dumps([d.metadata['Name'].lower() for d in m.distributions()]))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    names = {re.sub(r"[-_.]+", "-", n) for n in json.loads(seen.stdout)}
    for line in pins.splitlines():
        if line and not line.startswith("#"):
            assert line.split("==")[0] in names, line
