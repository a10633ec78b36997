"""What hpclaunch writes is private by default (issue 24, item 4): the modes of run and
sweep folders whatever the umask, `share = "group"`, secrets from a profile's [env]
kept out of every file, secret names by whole segments, secret values masked in the
record and given back to `rerun` from the environment. Local runs (no Slurm needed);
the same on the testbed is in test_e2e_private.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).parent / "programs"
POINT = str(PROGRAMS / "sweep_point.py")
HPCLAUNCH = str(Path(sys.executable).parent / "hpclaunch")


def walk(top: Path) -> Iterator[Path]:
    """top and everything under it (symlinks not followed)."""
    yield top
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            yield Path(folder) / name


def exposed(top: Path, who: int) -> list[str]:
    """Paths under `top` that `who` (stat.S_IRGRP|S_IXGRP, or the S_*OTH pair) can
    read: its read bit, and the search bit on every folder from `top` down to it."""
    read, search = who & (stat.S_IRGRP | stat.S_IROTH), who & (stat.S_IXGRP | stat.S_IXOTH)
    found = []
    for path in walk(top):
        if path.is_symlink():
            continue
        chain = [path.parent] if path != top else []
        while chain and chain[-1] != top.parent:
            chain.append(chain[-1].parent)
        if all(os.stat(p).st_mode & search for p in chain[:-1]) and os.stat(path).st_mode & read:
            found.append(f"{path} {stat.S_IMODE(os.stat(path).st_mode):o}")
    return found


GROUP = stat.S_IRGRP | stat.S_IXGRP
OTHERS = stat.S_IROTH | stat.S_IXOTH


def with_umask(
    mask: int, argv: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", f'umask {mask:03o} && exec "$@"', "sh", *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def local_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPCLAUNCH"))}
    env.update(
        HOME=str(tmp_path / "home"),
        XDG_DATA_HOME=str(tmp_path / "xdg-data"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg-config"),
        HPCLAUNCH_CLUSTER="local",
    )
    return env


def git_project(folder: Path) -> Path:
    """A git project with a committed and a changed file (a snapshot and a diff)."""
    folder.mkdir()
    (folder / "train.py").write_text("print('v1')\n")
    (folder / "tool.sh").write_text("#!/bin/sh\n")
    (folder / "tool.sh").chmod(0o755)
    for argv in (
        ["init", "-q"],
        ["add", "."],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1"],
    ):
        subprocess.run(["git", *argv], cwd=folder, check=True, capture_output=True)
    (folder / "train.py").write_text("print('v2')\n")
    return folder


def run_and_sweep(tmp_path: Path, mask: int, *extra: str) -> tuple[Path, dict[str, str]]:
    """A local run and a local Optuna sweep in a git project under umask `mask`."""
    pytest.importorskip("optuna")
    project = git_project(tmp_path / "proj")
    env = local_env(tmp_path)
    run = with_umask(
        mask, [HPCLAUNCH, "run", *extra, "--", sys.executable, "train.py"], project, env
    )
    assert run.returncode == 0, run.stderr
    out = tmp_path / "out"
    out.mkdir()
    (project / "space.yaml").write_text("x: {type: float, low: -3, high: 3}\n")
    sweep = with_umask(
        mask,
        [HPCLAUNCH, "sweep", *extra, "--optuna", "space.yaml", "--trials", "2", "--metric",
         "loss", "--", sys.executable, POINT, str(out), "--quadratic", "--x", "{x}"],
        project, env,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    return project, env


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_a_run_and_a_sweep_leave_nothing_readable_by_others(tmp_path: Path, mask: int) -> None:
    project, env = run_and_sweep(tmp_path, mask)
    runs, index = project / "runs", Path(env["XDG_DATA_HOME"]) / "hpclaunch"
    assert {p.name for p in (runs / "default").iterdir()} and (index / "runs.jsonl").is_file()
    assert list(runs.glob("default/*/git.diff"))
    assert list(runs.glob("default/*/optuna.journal"))
    for top in (runs, index):
        assert exposed(top, OTHERS) == []
        assert exposed(top, GROUP) == []
    # What hpclaunch itself makes has exactly the private modes (the job's own files, in
    # folders nobody else can enter, keep the job's umask: the user's).
    for path in [runs, runs / "default", *runs.glob("default/*"), *runs.glob("default/*/logs")]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    names = ("run.json", "spec.json", "job.sh", "git.diff", "sweep.json", "optuna.journal")
    made = [p for p in walk(runs) if p.name in names] + [index / "runs.jsonl"]
    assert len(made) > 8
    for path in made:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    assert stat.S_IMODE((index / "runs.jsonl").stat().st_mode) == 0o600


def test_share_group_makes_run_folders_group_readable_never_world(tmp_path: Path) -> None:
    project, env = run_and_sweep(tmp_path, 0o077, "--share", "group")
    runs = project / "runs"
    assert exposed(runs, OTHERS) == []
    readable = exposed(runs, GROUP)
    assert any(p.startswith(f"{runs}/default/") and "run.json" in p for p in readable)
    for path in [runs, *runs.glob("default/*")]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o750, path
    for path in walk(runs):
        if path.name in ("run.json", "spec.json", "job.sh", "sweep.json"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o640, path
    index = Path(env["XDG_DATA_HOME"]) / "hpclaunch" / "runs.jsonl"
    assert stat.S_IMODE(index.stat().st_mode) == 0o600  # the user's own list: never shared


def test_a_snapshot_copy_is_narrowed_to_its_folders_share(tmp_path: Path) -> None:
    """copy2 keeps a project's 0644/0755: narrowed to 0600/0700 (0640/0750 shared)."""
    from hpclaunch import snapshot

    project = git_project(tmp_path / "proj")
    for share_mode, want in ((0o700, {"train.py": 0o600, "tool.sh": 0o700}),
                             (0o750, {"train.py": 0o640, "tool.sh": 0o750})):  # fmt: skip
        run_dir = tmp_path / f"run-{share_mode:o}"
        run_dir.mkdir(mode=share_mode)
        run_dir.chmod(share_mode)
        snapshot.make(snapshot.plan(project), run_dir / "code")
        got = {n: stat.S_IMODE((run_dir / "code" / n).stat().st_mode) for n in want}
        assert got == want
