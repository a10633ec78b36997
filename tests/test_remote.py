"""The laptop side of --remote without a connection: where a command runs, ssh's
refusals as one line, what crosses, rsync's rules, the wheel, the API's words.
(tests/test_e2e_remote.py runs it all through a real sshd.)"""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from hpclaunch.errors import UserError
from hpclaunch.payload import snapshot
from hpclaunch.remote import choose, forward, ship, wheels
from hpclaunch.remote.build_id import fingerprint, package_files
from hpclaunch.remote.handle import option_words
from hpclaunch.remote.ssh import Host, refused


def test_host_forms() -> None:
    assert Host.parse("lumi") == Host("lumi", "lumi", None)
    assert Host.parse("me@login.example.org:2222") == Host(
        "me@login.example.org:2222", "me@login.example.org", "2222"
    )
    assert Host.parse("me@host").hostname == "host"
    for bad in ("", "-oProxyCommand=x", "a b", "x\0y"):
        with pytest.raises(UserError, match="--remote"):
            Host.parse(bad)


@pytest.mark.parametrize(
    ("stderr", "said"),
    [
        ("ssh: Could not resolve hostname nosuch: Name or service not known", "cannot find"),
        ("hpcuser@127.0.0.1: Permission denied (publickey).", "refused the login"),
        ("ssh: connect to host 127.0.0.1 port 9: Connection refused", "refused the connection"),
        ("Host key verification failed.", "host key"),
        ("kex_exchange_identification: read: Connection reset by peer", "cannot connect"),
    ],
)
def test_ssh_refusals_are_one_line_naming_the_host(stderr: str, said: str) -> None:
    line = refused(Host.parse("lumi"), stderr + "\n").render()
    assert "\n" not in line and "lumi" in line and said in line, line


def test_where_a_command_runs(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/nonexistent"}
    found = choose.choose(["--remote", "lumi", "status", "last"], tmp_path, env)
    assert found is not None and found.host == "lumi" and found.argv == ("status", "last")
    found = choose.choose(["run", "--remote=lumi", "--", "p", "--remote", "x"], tmp_path, env)
    assert found is not None and found.argv == ("run", "--", "p", "--remote", "x")
    assert choose.choose(["run", "--", "p", "--remote", "x"], tmp_path, env) is None
    assert choose.choose(["remote", "setup", "lumi"], tmp_path, env) is None
    with pytest.raises(UserError, match="needs a host"):
        choose.choose(["status", "--remote"], tmp_path, env)


def test_a_profiles_remote_and_the_login_node(tmp_path: Path) -> None:
    clusters = tmp_path / ".config" / "hpclaunch" / "clusters"
    clusters.mkdir(parents=True)
    (clusters / "mine.toml").write_text(
        'name = "mine"\nkind = "slurm"\n[remote]\nhost = "login.example.org"\n'
        'login_hostnames = ["uan*"]\n'
    )
    env = {"HOME": str(tmp_path), "PATH": "/nonexistent"}
    found = choose.choose(["status", "--cluster", "mine", "last"], tmp_path, env)
    assert found is not None and found.host == "login.example.org"
    via_env = choose.choose(["runs"], tmp_path, {**env, "HPCLAUNCH_CLUSTER": "mine"})
    assert via_env is not None and via_env.source == "profile mine"
    # On the login node itself (sbatch on PATH, or a matching hostname) it runs here.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\n")
    (bin_dir / "sbatch").chmod(0o755)
    assert (
        choose.choose(["runs", "--cluster", "mine"], tmp_path, {**env, "PATH": str(bin_dir)})
        is None
    )
    assert choose.on_login_node("x", ["*"], env)
    # Built-in profiles name no remote: no profile is even loaded for them.
    assert choose.choose(["runs"], tmp_path, {**env, "HPCLAUNCH_CLUSTER": "lumi"}) is None


def test_what_crosses_and_what_ships_first() -> None:
    laptop = {"WANDB_API_KEY": "k", "HF_TOKEN": "t", "WANDB_PROJECT": "p", "PATH": "/x"}
    # Secrets cross only by name (tests/test_remote_shipping.py: which names).
    assert forward.sent_environment(laptop) == {"WANDB_PROJECT": "p"}
    sent = forward.sent_environment(laptop, {"HF_TOKEN"})
    assert sent == {"HF_TOKEN": "t", "WANDB_PROJECT": "p"}
    assert forward.submits(["run", "--", "x"]) and forward.submits(["sweep", "--grid", "a=1"])
    assert not forward.submits(["sweep", "status", "last"]) and not forward.submits(["status"])
    argv, fetch = forward._rewrite_outputs(["plot", "last", "-o", "a.png", "--data=d.csv"], "T")
    assert argv == ["plot", "last", "-o", "T/0-a.png", "--data", "T/1-d.csv"]
    assert fetch == {"T/0-a.png": "a.png", "T/1-d.csv": "d.csv"}


def _git_project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text("print(1)\n")
    (root / "data" / "x.bin").write_text("x")
    (root / "we[i]rd*.txt").write_text("w")
    (root / ".gitignore").write_text("data/\nwe*.txt\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], [*git, "commit", "-qm", "x"]):
        subprocess.run(argv, cwd=root, check=True)
    return root


def test_ignored_paths_refused_and_excluded(tmp_path: Path) -> None:
    root = _git_project(tmp_path)
    with pytest.raises(UserError, match=r"git ignores data/x.bin.*not shipped to lumi"):
        ship.refuse_ignored(root, root, ["python", "train.py", "--in=data/x.bin"], "lumi")
    ship.refuse_ignored(root, root, ["python", "train.py", "nothere.bin"], "lumi")
    kept, ignored_paths = ship._git_lists(root)
    assert sorted(kept) == [".gitignore", "train.py"]
    rules = ship._rules(ignored_paths)
    assert "- /data" in rules and r"- /we\[i]rd\*.txt" in rules
    assert f"- {ship.RUN_FOLDER}" in rules and "- .stage-cache/" in rules


def test_snapshot_diff_leaves_the_index_alone(tmp_path: Path) -> None:
    root = _git_project(tmp_path)
    (root / "train.py").write_text("print(2)\n")
    index = root / ".git" / "index"
    before = index.stat().st_mtime_ns, index.read_bytes()
    os.utime(root / "train.py", ns=(before[0], before[0]))  # racily clean: git would refresh
    assert "print(2)" in snapshot.diff(root)
    assert (index.stat().st_mtime_ns, index.read_bytes()) == before


def test_the_shipped_wheel_holds_exactly_the_installed_files(tmp_path: Path) -> None:
    built = wheels.own_wheel(tmp_path)
    assert built.name.endswith(f"+b{fingerprint()}-py3-none-any.whl")
    with zipfile.ZipFile(built) as archive:
        names = archive.namelist()
    assert sorted(n[len("hpclaunch/") :] for n in names if n.startswith("hpclaunch/")) == (
        package_files()
    )
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert "stack" in wheels.extras() and "test" not in wheels.extras()
    assert any(r.startswith("py-spy") for r in wheels.requirements(["stack"]))
    assert not any(r.startswith("py-spy") for r in wheels.requirements())


def test_api_options_become_run_words() -> None:
    words = option_words({"nodes": 2, "env": ("A=1", "B=2"), "no_watch": True, "requeue": False})
    assert words == ["--nodes", "2", "--env", "A=1", "--env", "B=2", "--no-watch"]
