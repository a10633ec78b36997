"""What the README and `clean --help` claim about installing and leftovers, checked:
the install section names every user extra of pyproject.toml and the commands that
install or build hpclaunch; the demo's PATH line makes `hpclaunch` a command; a local
run removes its node-local folder when it ends however it ends, short of its hpclaunch
being killed (that case, and `clean` removing the folder: tests/test_local_hardening.py)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

from builders import local_env

REPO = Path(__file__).resolve().parents[1]
HPCLAUNCH = str(Path(sys.executable).parent / "hpclaunch")
PATH_LINE = 'export PATH="$PWD/.venv/bin:$PATH"'


def _section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_install_section_names_the_commands_and_every_extra() -> None:
    install = _section("Install")
    for command in ("python3 -m pip install .", "python3 -m pip wheel --no-deps -w dist .",
                    "python3 -m pip install dist/hpclaunch-*.whl"):  # fmt: skip
        assert command in install, command
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for_users = sorted(set(extras) - {"test", "bench"})  # the developers' own
    assert for_users == ["call", "jupyter", "optuna", "plot", "stack", "yaml"]
    named = set(re.findall(r"`(\w+)` \(", install))
    assert set(for_users) <= named, named


def test_the_demos_path_line_makes_hpclaunch_a_command() -> None:
    assert PATH_LINE in (REPO / "README.md").read_text()
    assert PATH_LINE in (REPO / "scripts" / "demo.sh").read_text()  # where the demo puts it
    shell = subprocess.run(
        ["bash", "-c", f"{PATH_LINE}; command -v hpclaunch && hpclaunch --version"],
        cwd=REPO, env={"PATH": "/usr/bin:/bin", "HOME": str(REPO)}, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.splitlines()[0] == str(REPO / ".venv" / "bin" / "hpclaunch")


def test_clean_help_says_what_happens_to_local_leftovers() -> None:
    shown = subprocess.run(
        [HPCLAUNCH, "clean", "--help"], capture_output=True, text=True, timeout=60, check=False
    ).stdout
    said = " ".join(shown.split())
    for claim in (
        "a local run removes its node-local folder itself when it ends (completed, failed,"
        " cancelled or Ctrl-C)",
        "killed (SIGKILL, a crash, a reboot) leaves its folder behind",
        "delete those with hpclaunch rm or hpclaunch gc",
    ):
        assert claim in said, claim


@pytest.mark.parametrize("how", ["completed", "failed", "cancelled", "ctrl-c"])
def test_a_local_run_removes_its_node_local_folder_when_it_ends(tmp_path: Path, how: str) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("x")
    code = 3 if how == "failed" else 0
    pause = 30 if how in ("cancelled", "ctrl-c") else 0  # ended from outside, or by itself
    program = f"import sys, time; time.sleep({pause}); sys.exit({code})"
    env = local_env(tmp_path)
    launcher = subprocess.Popen(
        [HPCLAUNCH, "run", "--stage", "data", "--", sys.executable, "-c", program],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    run_json = None
    deadline = time.monotonic() + 60
    while run_json is None or "local_dir" not in json.loads(run_json.read_text()):
        assert time.monotonic() < deadline, "the run never recorded its folder"
        found = list((tmp_path / "runs" / "default").glob("*/run.json"))
        run_json = found[0] if found else None
        time.sleep(0.1)
    local_dir = Path(json.loads(run_json.read_text())["local_dir"])
    if how == "cancelled":
        subprocess.run([HPCLAUNCH, "cancel", "last"], cwd=tmp_path, env=env, check=True,
                       capture_output=True, timeout=60)  # fmt: skip
    elif how == "ctrl-c":
        launcher.send_signal(signal.SIGINT)
    launcher.communicate(timeout=90)
    if how in ("completed", "failed"):
        assert launcher.returncode == code, how
    assert not local_dir.exists(), how
