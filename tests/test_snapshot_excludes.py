"""What a code snapshot leaves out: hpclaunch's own output (run roots, run folders, stage
caches) inside the project, ignored or not; and --snapshot-limit sizes in bytes (1K is
1 KiB), as the CLI shows them.

The snapshot itself (copies, links, diffs) is tests/test_snapshot.py's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch.basics import units
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.errors import UserError
from hpclaunch.payload import codeplan, snapshot, stage
from hpclaunch.records.runpaths import new_run_id, plan_paths
from test_snapshot import git

SRC = Path(__file__).resolve().parents[1] / "src"
RUN_ID = "20260101-120000-123-abcd"


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    """A project whose .gitignore does not mention runs/ (only data/)."""
    root = tmp_path / "proj"
    (root / "src").mkdir(parents=True)
    (root / "data").mkdir()
    git(root, "init", "-q")
    (root / ".gitignore").write_text("data/\n")
    (root / "train.py").write_text("print('hi')\n")
    (root / "src" / "model.py").write_text("W = 1\n")
    (root / "data" / "x.csv").write_text("1\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "x")
    return root


def earlier_runs(run_root: Path) -> None:
    """What earlier runs leave in a run root: run folders (one with a code snapshot, a
    nested checkout) and packed --stage data."""
    for run_id in (RUN_ID, "20260102-000000-000-0f0f"):
        run = run_root / "default" / run_id
        (run / "logs").mkdir(parents=True)
        (run / "run.json").write_text("{}")
        (run / "logs" / "rank-0.out").write_text("x" * 5000)
        (run / "code" / "src").mkdir(parents=True)
        (run / "code" / "src" / "model.py").write_text("W = 0\n")
    pack = run_root / stage.CACHE / "DATA-0123456789abcdef0123"
    pack.mkdir(parents=True)
    (pack / "part-00.tar").write_bytes(b"\0" * 10240)


def tree(folder: Path) -> list[str]:
    """Every entry of a snapshot folder, a symlink as 'name -> target'."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(folder).as_posix()
            out.append(f"{rel} -> {os.readlink(path)}" if path.is_symlink() else rel)
    return sorted(out)


def plan_and_make(
    root: Path, dest: Path, leave_out: list[Path]
) -> tuple[snapshot.SnapshotPlan, list[str]]:
    p = snapshot.plan_snapshot(root, leave_out)
    snapshot.make(p, dest)
    return p, tree(dest)


@pytest.mark.parametrize("ignored", [False, True], ids=["runs-not-ignored", "runs-ignored"])
def test_earlier_runs_in_the_run_root_change_nothing(
    proj: Path, tmp_path: Path, ignored: bool
) -> None:
    if ignored:
        (proj / ".gitignore").write_text("data/\nruns/\n")
    run_root = proj / "runs"
    before = plan_and_make(proj, tmp_path / "s1", [run_root])
    earlier_runs(run_root)
    (run_root / "notes.txt").write_text("anything under the run root")
    after = plan_and_make(proj, tmp_path / "s2", [run_root])
    assert after == before
    p = before[0]
    assert (p.files, p.links) == ((".gitignore", "src/model.py", "train.py"), ("data",))
    assert p.total_bytes == sum((proj / f).stat().st_size for f in p.files)


def test_a_run_root_given_relative_or_through_a_symlink(
    proj: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = (".gitignore", "out/keep.txt", "src/model.py", "train.py")
    (proj / "out" / "runs").mkdir(parents=True)
    (proj / "out" / "keep.txt").write_text("kept: only out/runs is the run root\n")
    (proj / "out" / "runs" / "a.txt").write_text("output")
    monkeypatch.chdir(proj / "src")
    assert snapshot.plan_snapshot(proj, [Path("../out/runs")]).files == want
    alias = tmp_path / "scratch-runs"  # --run-root /scratch/... that is a link into the project
    alias.symlink_to(proj / "out" / "runs")
    assert snapshot.plan_snapshot(proj, [alias]).files == want
    # The project reached through a symlink (/home -> /gpfs/home), the run root too.
    home = tmp_path / "home"
    home.symlink_to(proj)
    p = snapshot.plan_snapshot(home, [home / "out" / "runs"])
    assert p.files == want
    snapshot.make(p, tmp_path / "snap", exclude=home / "out" / "runs")
    assert not (tmp_path / "snap" / "out" / "runs").exists()


def test_a_run_root_that_is_a_symlink_in_the_project_is_left_out(
    proj: Path, tmp_path: Path
) -> None:
    (tmp_path / "scratch").mkdir()
    (proj / "runs").symlink_to(tmp_path / "scratch")  # untracked, not ignored: a copied link
    assert "runs" in snapshot.plan_snapshot(proj).files
    assert "runs" not in snapshot.plan_snapshot(proj, [proj / "runs"]).files


def test_a_run_root_outside_the_project_changes_nothing(proj: Path, tmp_path: Path) -> None:
    (proj / "runs").mkdir()
    (proj / "runs" / "config.yaml").write_text("user code that is not a run\n")
    outside = tmp_path / "elsewhere" / "runs"
    earlier_runs(outside)
    assert snapshot.plan_snapshot(proj, [outside]) == snapshot.plan_snapshot(proj)
    assert "runs/config.yaml" in snapshot.plan_snapshot(proj, [outside]).files


@pytest.mark.parametrize("level", [0, 1, 2])
def test_a_run_root_at_or_above_the_project_never_leaves_the_project_out(
    proj: Path, tmp_path: Path, level: int
) -> None:
    root = [proj, proj.parent, proj.parent.parent][level]
    full = snapshot.plan_snapshot(proj)
    assert snapshot.plan_snapshot(proj, [root]) == full
    stats = snapshot.make(snapshot.plan_snapshot(proj, [root]), tmp_path / "snap", exclude=root)
    assert stats.files == len(full.files) == 3 and stats.links == 1


def test_run_folders_and_stage_caches_of_any_run_root_are_left_out(
    proj: Path, tmp_path: Path
) -> None:
    """The reported case: local runs filled an un-ignored ./runs; a LUMI run, whose run root
    is on /scratch, must not take them in."""
    before = plan_and_make(proj, tmp_path / "s1", [tmp_path / "scratch" / "runs"])
    earlier_runs(proj / "runs")  # --cluster local's run root
    earlier_runs(proj / "results")  # an earlier --run-root results
    earlier_runs(proj / "src" / "runs")  # runs started from src/
    after = plan_and_make(proj, tmp_path / "s2", [tmp_path / "scratch" / "runs"])
    assert after == before


def test_git_is_not_asked_to_walk_earlier_run_folders(
    proj: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Performance (issue 26): a ./runs that is neither ignored nor the run root may hold
    75,000 files of earlier runs; git prunes run folders and stage caches (pathspecs)
    instead of listing their files for gone() to drop one by one."""
    earlier_runs(proj / "runs")
    earlier_runs(proj / "src" / "deeper" / "runs")
    (proj / "runs" / "notes.md").write_text("kept\n")  # beside the run folders: copied
    listed: list[str] = []
    real = snapshot._ls_files

    def spy(root: Path, args: list[str]) -> list[str]:
        names = real(root, args)
        listed.extend(names)
        return names

    monkeypatch.setattr(snapshot, "_ls_files", spy)
    found = snapshot.plan_snapshot(proj, [tmp_path / "scratch" / "runs"])
    assert "runs/notes.md" in found.files and "train.py" in found.files
    output = re.compile(rf"(^|/)({re.escape(stage.CACHE)}|{snapshot.RUN_ID.pattern})/")
    assert [n for n in listed if output.search(n)] == []


def test_a_nested_repository_holding_the_run_root(proj: Path, tmp_path: Path) -> None:
    lib = proj / "lib"
    (lib / "pkg").mkdir(parents=True)
    git(lib, "init", "-q")  # a nested checkout: git lists "lib/", copied as a tree
    (lib / "pkg" / "core.py").write_text("CORE = 1\n")
    earlier_runs(lib / "runs")
    (lib / "outs").mkdir()
    (lib / "outs" / "big.bin").write_bytes(b"\0" * 4096)
    p = snapshot.plan_snapshot(proj, [lib / "outs"])
    assert "lib" in p.files
    assert p.total_bytes == sum(
        (proj / f).stat().st_size for f in (".gitignore", "src/model.py", "train.py")
    ) + len("CORE = 1\n")
    snapshot.make(p, tmp_path / "snap")
    assert [e for e in tree(tmp_path / "snap") if e.startswith("lib")] == [
        "lib",
        "lib/pkg",
        "lib/pkg/core.py",
    ]


def _plan_code(
    cwd: Path, run_root: str = "runs", checkpoint_root: str = "", limit: int = 200 << 20
) -> codeplan.CodePlan:
    job = JobSpec(
        cluster="slurm",
        program=("python3", "train.py"),
        snapshot=True,
        run_root=run_root,
        checkpoint_root=checkpoint_root,
        snapshot_limit_bytes=limit,  # bytes, despite the name
    )
    paths = plan_paths(job.run_root, job.exp, job.checkpoint_root, cwd)
    return codeplan.plan_code(job, cwd, paths)


def test_plan_code_leaves_this_runs_folders_out(proj: Path) -> None:
    full = snapshot.plan_snapshot(proj).files
    for folder in ("src/out", "src/ckpt", "default", ".stage-cache"):
        (proj / folder).mkdir(parents=True)
        (proj / folder / "x.txt").write_text("output")
    # --run-root out and a checkpoint root, both relative to the working folder (src/).
    code = _plan_code(proj / "src", run_root="out", checkpoint_root="ckpt")
    assert code.plan is not None
    assert code.plan.files == (*full[:1], "default/x.txt", *full[1:])
    assert code.plan.left_out == ("src/out", "src/ckpt")
    # --run-root . (the project): the experiment's folder and the stage cache only.
    code = _plan_code(proj, run_root=".")
    assert code.plan is not None
    assert code.plan.files == tuple(sorted(("src/ckpt/x.txt", "src/out/x.txt", *full)))
    assert code.plan.left_out == (".stage-cache", "default")


def test_plan_code_checks_the_limit_in_bytes(proj: Path) -> None:
    (proj / "big.bin").write_bytes(b"\0" * 2048)
    assert _plan_code(proj, limit=4 << 10).plan is not None
    with pytest.raises(UserError, match=r"\(limit 1K\)\. Largest: big\.bin 2\.0 KB"):
        _plan_code(proj, limit=1 << 10)


def test_the_run_folder_name_and_the_stage_cache_are_the_ones_hpclaunch_writes() -> None:
    assert snapshot.STAGE_CACHE == stage.CACHE
    assert snapshot.RUN_ID.fullmatch(new_run_id())
    assert snapshot.RUN_ID.fullmatch(RUN_ID)


# ---- --snapshot-limit: a size in bytes ----------------------------------------------


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("1K", 1024),
        ("1k", 1024),
        ("64KB", 65536),
        ("500M", 500 << 20),
        ("500", 500 << 20),  # a plain number is MB, as for --mem
        ("2G", 2 << 30),
        ("1T", 1 << 40),
        (" 3K ", 3072),
        ("0", 0),
    ],
)
def test_parse_size(text: str, nbytes: int) -> None:
    assert units.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "big", "-1K", "1.5G", "1 K", "2X", "K"])
def test_parse_size_refuses_garbage(text: str) -> None:
    with pytest.raises(UserError) as err:
        units.parse_size(text, "--snapshot-limit")
    assert str(err.value).startswith("--snapshot-limit: ")
    assert "K, M, G or T" in str(err.value)


@pytest.mark.parametrize("text", ["1K", "1536K", "200M", "1G", "3T", "0"])
def test_format_size_gives_back_the_shortest_slurm_form(text: str) -> None:
    assert units.format_size(units.parse_size(text)) == text
    assert units.format_size(2048 * 1024) == "2M"
    assert units.format_size(1000) == "1000 bytes"


def test_a_limit_under_one_megabyte_is_kept_exactly(proj: Path) -> None:
    (proj / "big.bin").write_bytes(b"\0" * 2048)
    p = snapshot.plan_snapshot(proj)
    snapshot.check_limit(p, 4 << 10)
    snapshot.check_limit(p, 0)  # no limit
    with pytest.raises(UserError) as err:
        snapshot.check_limit(p, 1 << 10)
    line = str(err.value)
    assert re.match(r"--snapshot-limit: the code snapshot is 2\.\d KB \(limit 1K\)\. ", line)
    assert "Largest: big.bin 2.0 KB, " in line


def hpclaunch(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpclaunch", *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(SRC)},  # this checkout's hpclaunch
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def cli_env(tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "USER": "alice",
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "LANG": "C.UTF-8",
    }


def entries(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    found = re.search(r"the job would run a code snapshot: (\d+) entries", proc.stderr)
    assert found, proc.stderr
    return found.group(1)


def test_lumi_dry_run_after_local_runs_in_an_unignored_runs_folder(
    proj: Path, tmp_path: Path
) -> None:
    env = cli_env(tmp_path)
    lumi = ["run", "--dry-run", "--cluster", "lumi", "-A", "project_465000000", "--"]
    before = entries(hpclaunch([*lumi, "python", "train.py"], proj, env))
    for _ in range(2):  # local runs write ./runs (untracked, not ignored)
        done = hpclaunch(["run", "--cluster", "local", "--", "python3", "train.py"], proj, env)
        assert done.returncode == 0, done.stderr
    assert len(list((proj / "runs" / "default").iterdir())) == 2
    assert entries(hpclaunch([*lumi, "python", "train.py"], proj, env)) == before == "3"


@pytest.mark.testbed
def test_snapshot_limit_1k_through_a_slurm_dry_run(slurm_conf: Path, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    git(project, "init", "-q")
    (project / "prog.py").write_text("print('hi')\n")
    (project / "weights.bin").write_bytes(b"\0" * 2048)
    env = {**cli_env(tmp_path), "SLURM_CONF": str(slurm_conf)}
    run = ["run", "--cluster", "slurm", "--dry-run", "--snapshot-limit"]
    refused = hpclaunch([*run, "1K", "--", "python3", "prog.py"], project, env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = refused.stderr.strip()
    assert "\n" not in line, line
    assert line.startswith("hpclaunch: error: --snapshot-limit: the code snapshot is 2.0 KB")
    assert "(limit 1K). Largest: weights.bin 2.0 KB, prog.py 12 B; " in line
    assert entries(hpclaunch([*run, "3K", "--", "python3", "prog.py"], project, env)) == "2"
    assert entries(hpclaunch([*run, "0", "--", "python3", "prog.py"], project, env)) == "2"
    assert entries(hpclaunch([*run, "1", "--", "python3", "prog.py"], project, env)) == "2"
    assert not (project / "runs").exists()
