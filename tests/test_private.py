"""What hpclaunch writes is private by default (issue 24, item 4): the modes of run and
sweep folders whatever the umask, `share = "group"`, secrets from a profile's [env]
kept out of every file, secret names by whole segments, secret values masked in the
record and given back to `rerun` from the environment. Local runs (no Slurm needed);
the same on the testbed is in test_e2e_private.py."""

from __future__ import annotations

import json
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
    (project / "data").mkdir()
    (project / "data" / "a.txt").write_text("staged\n")
    env = local_env(tmp_path)
    extra = (*extra, "--stage", "data")  # the stage cache too
    run = with_umask(
        mask, [HPCLAUNCH, "run", *extra, "--", sys.executable, "train.py"], project, env
    )
    assert run.returncode == 0, run.stderr
    out = tmp_path / "out"
    out.mkdir()
    (project / "space.yaml").write_text("x: {type: float, low: -3, high: 3}\n")
    sweep = with_umask(
        mask,
        [HPCLAUNCH, "sweep", *extra[:-2], "--optuna", "space.yaml", "--trials", "2", "--metric",
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
    assert [p.name for p in (runs / ".stage-cache").iterdir()]
    for top in (runs, index):
        assert exposed(top, OTHERS) == []
        assert exposed(top, GROUP) == []
    # What hpclaunch itself makes has exactly the private modes (the job's own files, in
    # folders nobody else can enter, keep the job's umask: the user's).
    folders = [runs, runs / "default", runs / ".stage-cache", *runs.glob(".stage-cache/*")]
    for path in [*folders, *runs.glob("default/*"), *runs.glob("default/*/logs")]:
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
    from hpclaunch.payload import snapshot

    project = git_project(tmp_path / "proj")
    for share_mode, want in ((0o700, {"train.py": 0o600, "tool.sh": 0o700}),
                             (0o750, {"train.py": 0o640, "tool.sh": 0o750})):  # fmt: skip
        run_dir = tmp_path / f"run-{share_mode:o}"
        run_dir.mkdir(mode=share_mode)
        run_dir.chmod(share_mode)
        snapshot.make(snapshot.plan_snapshot(project), run_dir / "code")
        got = {n: stat.S_IMODE((run_dir / "code" / n).stat().st_mode) for n in want}
        assert got == want


SECRET = "s3cr3t-Value-Of-Pass-42"


def hpclaunch(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPCLAUNCH, *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def files_holding(text: str, *tops: Path) -> list[str]:
    found = []
    for top in tops:
        for path in walk(top):
            if path.is_file() and not path.is_symlink() and text.encode() in path.read_bytes():
                found.append(str(path))
    return found


CHECK_ENV = (
    "import os, sys; want = dict(a.split('=', 1) for a in sys.argv[1:]); "
    "bad = [k for k, v in want.items() if os.environ.get(k) != v]; "
    "print('env ok' if not bad else 'env differs: ' + ' '.join(bad)); sys.exit(3 if bad else 0)"
)


def test_a_profile_env_secret_reaches_the_ranks_and_no_file(tmp_path: Path) -> None:
    env = local_env(tmp_path)
    clusters = Path(env["XDG_CONFIG_HOME"]) / "hpclaunch" / "clusters"
    clusters.mkdir(parents=True)
    (clusters / "local.toml").write_text(
        f'[env]\nDB_PASS = "{SECRET}"\nPLAIN_SETTING = "visible-1"\n'
    )
    work = tmp_path / "work"
    work.mkdir()
    # The program checks the values it sees without printing them: argv carries them
    # hex-encoded, so no file of the run can hold the secret because of the check itself.
    argv = [
        "--",
        sys.executable,
        "-c",
        CHECK_ENV.replace("a.split", "bytes.fromhex(a).decode().split"),
    ]
    argv += [f"DB_PASS={SECRET}".encode().hex(), b"PLAIN_SETTING=visible-1".hex()]
    dry = hpclaunch(["run", "--dry-run", *argv], work, env)
    dry_json = hpclaunch(["run", "--dry-run", "--json", *argv], work, env)
    for shown in (dry, dry_json):
        assert shown.returncode == 0, shown.stderr
        assert SECRET not in shown.stdout + shown.stderr
    assert "DB_PASS" in dry.stdout and "PLAIN_SETTING" in dry.stdout
    done = hpclaunch(["run", "--wait", *argv], work, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "env ok" in done.stdout + done.stderr
    assert SECRET not in done.stdout + done.stderr
    run_dir = next((work / "runs" / "default").iterdir())
    assert "visible-1" in (run_dir / "job.sh").read_text()  # a plain profile value stays
    assert files_holding(SECRET, work / "runs", Path(env["XDG_DATA_HOME"])) == []


def test_a_secret_also_given_as_an_argument_is_masked_and_rerun_reproduces_it(
    tmp_path: Path,
) -> None:
    env = {**local_env(tmp_path), "GITHUB_PAT": SECRET}
    work = tmp_path / "work"
    work.mkdir()
    program = [sys.executable, "-c", CHECK_ENV, f"GITHUB_PAT={SECRET}"]
    first = hpclaunch(["run", "--wait", "--env", "GITHUB_PAT", "--", *program], work, env)
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = next((work / "runs" / "default").iterdir())
    record = json.loads((run_dir / "run.json").read_text())
    assert record["command"][-1] == "GITHUB_PAT=$GITHUB_PAT"
    assert record["masked_secrets"] == ["GITHUB_PAT"]
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["program"][-1] == "GITHUB_PAT=$GITHUB_PAT"
    for name in ("run.json", "spec.json"):
        assert SECRET not in (run_dir / name).read_text()
    assert files_holding(SECRET, Path(env["XDG_DATA_HOME"])) == []
    shown = hpclaunch(["show", run_dir.name], work, env)  # job.sh too, as the record has it
    assert shown.returncode == 0 and "GITHUB_PAT=$GITHUB_PAT" in shown.stdout, shown.stderr
    assert SECRET not in shown.stdout
    again = hpclaunch(["rerun", run_dir.name, "--wait"], work, env)
    assert again.returncode == 0, again.stdout + again.stderr  # the program saw the value
    assert "env ok" in again.stdout + again.stderr
    missing = {k: v for k, v in env.items() if k != "GITHUB_PAT"}
    refused = hpclaunch(["rerun", run_dir.name], work, missing)
    assert refused.returncode == 2
    error = [line for line in refused.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "GITHUB_PAT" in error[0], refused.stderr
    assert len(list((work / "runs" / "default").iterdir())) == 2  # nothing submitted


def test_env_name_alone_takes_the_value_from_the_environment(tmp_path: Path) -> None:
    env = local_env(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    refused = hpclaunch(["run", "--env", "NOT_THERE_TOKEN", "--", "true"], work, env)
    assert refused.returncode == 2
    assert "NOT_THERE_TOKEN is not set" in refused.stderr and refused.stderr.count("\n") == 1


def test_secret_names_are_whole_segments() -> None:
    from hpclaunch.config.secretnames import is_secret

    for name in ("GITHUB_PAT", "DB_PASS", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "SENTRY_DSN",
                 "my_api_key", "SESSION_COOKIE", "SSH_PRIVATE_KEY", "GOOGLE_CREDENTIALS",
                 "BASIC_AUTH", "MYSQL_PASSWD", "WANDB_API_KEY"):  # fmt: skip
        assert is_secret(name, extra=()), name
    for name in ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "TOKENIZERS_PARALLELISM",
                 "KEYBOARD", "PASSTHROUGH", "MONKEY_PATCH", "HPCLAUNCH_RUN_DIR"):  # fmt: skip
        assert not is_secret(name, extra=()), name
    assert is_secret("MY_LICENCE", extra=("my_licence",))


def test_a_users_config_adds_secret_names(tmp_path: Path) -> None:
    from hpclaunch.config.secretnames import extra_names

    config = tmp_path / "hpclaunch" / "config.toml"
    config.parent.mkdir()
    config.write_text('secret_names = ["MY_LICENCE", "corp_seat"]\n')
    assert extra_names({"XDG_CONFIG_HOME": str(tmp_path)}) == {"MY_LICENCE", "CORP_SEAT"}
    assert extra_names({"XDG_CONFIG_HOME": str(tmp_path / "none")}) == frozenset()


def test_path_still_crosses_to_a_cluster_as_itself() -> None:
    """--remote: the laptop sends its secrets on SSH's standard input, and the command
    line as typed. PATH (and PYTHONPATH, TOKENIZERS_PARALLELISM) are no secrets: the
    laptop's own never replaces the cluster's, and `--env PATH=...` reaches job.sh as
    an ordinary export."""
    from hpclaunch.config.secretnames import is_secret
    from hpclaunch.remote.forward import sent_environment

    laptop = {"PATH": "/laptop/bin", "PYTHONPATH": "/x", "GITHUB_PAT": "p" * 10,
              "DB_PASS": "q" * 10, "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    sent = sent_environment(laptop)
    assert "PATH" not in sent and "PYTHONPATH" not in sent and "TOKENIZERS_PARALLELISM" not in sent
    assert not {"GITHUB_PAT", "DB_PASS"} & set(sent)  # secrets cross only when named
    sent = sent_environment(laptop, names=("GITHUB_PAT", "DB_PASS", "PATH"))
    assert {"GITHUB_PAT", "DB_PASS"} <= set(sent)
    assert sent["PATH"] == "/laptop/bin"  # named (--forward-env PATH): crosses as itself
    assert not is_secret("PATH", extra=()) and is_secret("GITHUB_PAT", extra=())


def test_a_profile_shares_with_the_group_and_the_sweep_dry_run_masks(tmp_path: Path) -> None:
    env = {**local_env(tmp_path), "HF_TOKEN": SECRET}
    clusters = Path(env["XDG_CONFIG_HOME"]) / "hpclaunch" / "clusters"
    clusters.mkdir(parents=True)
    (clusters / "local.toml").write_text('share = "group"\n')
    work = tmp_path / "work"
    work.mkdir()
    done = hpclaunch(["run", "--wait", "--", "true"], work, env)
    assert done.returncode == 0, done.stderr
    run_dir = next((work / "runs" / "default").iterdir())
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o750
    assert stat.S_IMODE((run_dir / "run.json").stat().st_mode) == 0o640
    dry = hpclaunch(["sweep", "--dry-run", "--grid", "lr=1,2", "--env", "HF_TOKEN", "--",
                     "python3", "x.py", SECRET], work, env)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert SECRET not in dry.stdout + dry.stderr and "$HF_TOKEN" in dry.stdout


def test_made_folders_keep_a_team_run_roots_setgid_bit(tmp_path: Path) -> None:
    """A team's run root with the setgid bit gives its group to what is made below; the
    exact modes hpclaunch sets keep that bit, so files inside get the team's group."""
    from hpclaunch.basics import filemodes

    root = tmp_path / "team-runs"
    root.mkdir()
    root.chmod(0o2750)
    old = os.umask(0o022)
    try:
        filemodes.make_dirs(root / "exp" / "run", "group")
    finally:
        os.umask(old)
    for folder in (root / "exp", root / "exp" / "run"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o2750, folder
