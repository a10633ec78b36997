"""What a laptop ships and sends (issue 24, item 5), without a connection: --ship
outside a git work tree and its size limit, the credentials never shipped nor
snapshotted, the secrets that cross (only those a command uses), the cluster side's
prune after a ship, and the SSH control folder another user made (item 6).
(tests/test_e2e_remote.py shows the same through the testbed's real sshd.)"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hpclaunch.errors import UserError
from hpclaunch.payload import snapshot
from hpclaunch.remote import forward, ship
from test_snapshot import git

RUN_ID = "20260101-120000-123-abcd"


def test_outside_git_shipping_needs_a_named_folder(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    with pytest.raises(UserError) as refused:
        ship.ship_root(tmp_path, None)
    line = refused.value.line()
    assert "\n" not in line and "--ship" in line and "not in a git work tree" in line, line
    assert ship.ship_root(tmp_path, Path(".")) == (tmp_path.resolve(), False)
    with pytest.raises(UserError, match="--ship: nothere is not a folder"):
        ship.ship_root(tmp_path, Path("nothere"))


def test_a_named_folder_is_walked_within_its_size_limit(tmp_path: Path) -> None:
    for rel in ("a.py", "pkg/b.py", "pkg/c.bin"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x" * 1024)
    planted = (".env", ".env.prod", ".ssh/id_rsa", "pkg/server.pem", "aws/credentials")
    for rel in (*planted, f"runs/{RUN_ID}/out.log", ".stage-cache/p", "__pycache__/a.pyc"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"k" * 4096)
    files, withheld = ship._walk(tmp_path, 3 << 10)
    assert sorted(files) == ["a.py", "pkg/b.py", "pkg/c.bin"]
    assert sorted(withheld) == [".env", ".env.prod", ".ssh/", "aws/credentials", "pkg/server.pem"]
    with pytest.raises(UserError) as refused:
        ship._walk(tmp_path, 2 << 10)
    line = refused.value.line()
    assert "\n" not in line and "more than 2K" in line and "ship_limit" in line, line
    assert ship.SHIP_LIMIT == 2 << 30


def test_credentials_left_out_of_a_git_ship_whatever_git_says() -> None:
    kept = ["a.py", ".ssh/config", ".ssh/id_rsa", "x/credentials", "deploy/id_ed25519.pub"]
    shipped, withheld = ship._withheld([*kept, ".netrc", ".pypirc", "k.key", "id_ecdsa"])
    assert shipped == ["a.py"]
    assert withheld[:3] == [".ssh/", "x/credentials", "deploy/id_ed25519.pub"]
    assert withheld[3:] == [".netrc", ".pypirc", "k.key", "id_ecdsa"]
    rules = ship._rules([])
    for pattern in snapshot.NEVER_SHIPPED:  # rsync leaves them out (and alone there) too
        assert f"- {pattern}" in rules
    assert rules[-2:] == ["R /.git/***", "P *"]
    assert not snapshot.never_shipped("src/keys.py") and not snapshot.never_shipped(".envrc")


def test_credentials_are_never_snapshotted(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "deploy").mkdir(parents=True)
    git(root, "init", "-q")
    (root / ".gitignore").write_text("*.local\n")
    (root / "train.py").write_text("print(1)\n")
    (root / "deploy" / "id_rsa").write_text("KEY\n")
    (root / "server.pem").write_text("PEM\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "x")  # tracked, and still never snapshotted
    (root / ".env").write_text("TOKEN=x\n")  # untracked, not ignored
    (root / ".env.local").write_text("TOKEN=y\n")  # ignored: would be linked
    plan = snapshot.plan_snapshot(root)
    assert sorted(plan.files) == [".gitignore", "train.py"]
    assert plan.links == ()
    snapshot.make(plan, tmp_path / "snap")
    made = sorted(
        p.relative_to(tmp_path / "snap").as_posix() for p in (tmp_path / "snap").rglob("*")
    )
    assert made == [".gitignore", "train.py"]


def test_only_the_secrets_a_command_uses_cross(tmp_path: Path) -> None:
    laptop = {
        "OTHER_TOKEN": "o",
        "HF_TOKEN": "h",
        "MY_KEY": "k",
        "DB_PASSWORD": "p",
        "WANDB_API_KEY": "w",
        "WANDB_PROJECT": "proj",
        "HPCLAUNCH_CLUSTER": "lumi",
        "PATH": "/bin",
    }
    argv, opts = forward.split_laptop_options(
        ["run", "--forward-env", "HF_TOKEN", "--ship=src", "--env", "MY_KEY=v", "--", "p",
         "--forward-env", "X"]
    )  # fmt: skip
    assert argv == ["run", "--env", "MY_KEY=v", "--", "p", "--forward-env", "X"]
    assert opts == forward.LaptopOptions("src", ("HF_TOKEN",))
    sent = forward.sent_environment(laptop, forward.used_names(argv, opts.forward_env))
    assert sent == {
        "HF_TOKEN": "h",
        "MY_KEY": "k",
        "WANDB_PROJECT": "proj",
        "HPCLAUNCH_CLUSTER": "lumi",
    }
    assert forward.used_names(["run", "--env=DB_PASSWORD", "--", "p"]) == {"DB_PASSWORD"}
    # A W&B sweep uses the W&B key; a plain run or a grid sweep does not.
    wandb = ["sweep", "--wandb-sweep", "e/p/id", "--count", "2", "--", "python", "t.py"]
    assert forward.used_names(wandb) == {"WANDB_API_KEY"}
    assert forward.used_names(["sweep", "--grid", "x=1", "--", "p"]) == set()
    assert forward.used_names(["run", "--", "p", "--wandb-sweep"]) == set()
    for bad in (["run", "--forward-env"], ["run", "--ship", "--wait"]):
        with pytest.raises(UserError, match="needs a value"):
            forward.split_laptop_options(bad)
    with pytest.raises(UserError, match="--forward-env: '1X' is not a valid"):
        forward.split_laptop_options(["run", "--forward-env", "1X"])


def test_the_config_files_forward_env(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert forward.config_forward_env(env) == ()
    config = tmp_path / ".config" / "hpclaunch" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('forward_env = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]\n')
    assert forward.config_forward_env(env) == ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
    config.write_text('forward_env = "HF_TOKEN"\n')
    with pytest.raises(
        UserError, match=r"config.toml forward_env: 'HF_TOKEN' is not a list of strings"
    ):
        forward.config_forward_env(env)


def test_a_config_file_another_user_can_change_forwards_nothing(tmp_path: Path) -> None:
    """forward_env sends secrets to a host: read only from a config file that is the
    user's and writable by them alone (userconfig.read_owned), like every other key."""
    env = {"HOME": str(tmp_path)}
    config = tmp_path / ".config" / "hpclaunch" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('forward_env = ["AWS_SECRET_ACCESS_KEY"]\n')
    config.chmod(0o664)  # group-writable: a colleague could have written the list
    assert forward.config_forward_env(env) == ()
    config.chmod(0o644)
    assert forward.config_forward_env(env) == ("AWS_SECRET_ACCESS_KEY",)
    os.chown(config, 4242, 4242)  # another user's (the tests run as root)
    assert forward.config_forward_env(env) == ()


def test_prune_removes_only_what_an_earlier_ship_sent(tmp_path: Path) -> None:
    mirror = tmp_path / "projects" / "demo-0123456789"
    for rel in ("a.py", "pkg/b.py", "pkg/deep/c.py", "keep.py"):
        (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
        (mirror / rel).write_text(rel)
    assert ship.prune(mirror, ["a.py", "pkg/b.py", "pkg/deep/c.py", "keep.py", "../x"]) == 0
    listing = mirror.parent / "demo-0123456789.shipped"
    assert listing.stat().st_mode & 0o077 == 0
    # Written there: an output beside shipped files, an ignored folder, a symlinked folder.
    (mirror / "pkg" / "out.log").write_text("log")
    (mirror / "outputs").mkdir()
    (mirror / "outputs" / "r.txt").write_text("r")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "b.py").write_text("not the mirror's")
    assert ship.prune(mirror, ["keep.py", "pkg/b.py"]) == 2
    assert sorted(p.relative_to(mirror).as_posix() for p in mirror.rglob("*")) == [
        "keep.py",
        "outputs",
        "outputs/r.txt",
        "pkg",
        "pkg/b.py",
        "pkg/out.log",
    ]
    # A folder replaced by a symlink: nothing through it is removed.
    (mirror / "pkg" / "b.py").unlink()
    (mirror / "pkg" / "out.log").unlink()
    (mirror / "pkg").rmdir()
    (mirror / "pkg").symlink_to(elsewhere)
    assert ship.prune(mirror, ["keep.py"]) == 0
    assert (elsewhere / "b.py").read_text() == "not the mirror's"


def test_a_ctrl_c_while_the_shipped_list_is_written_leaves_nothing_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = tmp_path / "projects" / "demo-0123456789"
    (mirror / "pkg").mkdir(parents=True)
    (mirror / "pkg" / "a.py").write_text("a")
    names = ["pkg/a.py", os.fsdecode(b"caf\xe9.py")]  # a name that is not UTF-8 too

    def interrupted(src: object, dst: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", interrupted)
        with pytest.raises(KeyboardInterrupt):
            ship.prune(mirror, names)
    assert sorted(p.name for p in mirror.parent.iterdir()) == ["demo-0123456789"]
    ship.prune(mirror, names)
    listing = mirror.parent / "demo-0123456789.shipped"
    assert json.loads(listing.read_text(encoding="ascii")) == sorted(names)


def test_a_control_folder_another_user_made_is_one_line() -> None:
    """The /tmp fallback (HOME too long for a socket path) planted by hpcother, a folder
    and a symlink: the laptop user hpclaptop gets one line naming it, no traceback."""
    laptop = pytest.importorskip("laptop")
    if laptop.available():
        pytest.skip(laptop.available())
    import testbed

    me = pwd.getpwnam(laptop.USER)
    other = pwd.getpwnam(testbed.OTHER_USER)
    shared = Path(tempfile.mkdtemp(prefix="hpclaunch-test-"))
    try:
        shared.chmod(0o1777)  # a /tmp of its own: sticky, everyone's
        planted = shared / f"hpclaunch-ssh-{me.pw_uid}"
        target = shared / "others"
        for kind in ("folder", "symlink"):
            if kind == "folder":
                planted.mkdir(mode=0o755)
                os.chown(planted, other.pw_uid, other.pw_gid)
            else:
                planted.rmdir()
                target.mkdir(mode=0o755)
                os.chown(target, other.pw_uid, other.pw_gid)
                planted.symlink_to(target)
                os.lchown(planted, other.pw_uid, other.pw_gid)
            long_home = "/nonexistent/" + "h" * 100
            done = laptop.Laptop(laptop.home()).cmd(
                # HOME after runuser, which sets the user's own
                ["/usr/bin/env", f"HOME={long_home}", laptop.HPCLAUNCH,
                 "--remote", "testbed-login", "status", "last"],
                env={"TMPDIR": str(shared)},
            )  # fmt: skip
            assert done.returncode == 2, (kind, done.stdout, done.stderr)
            assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, (
                kind,
                done.stderr,
            )
            assert f"ssh control folder: {planted} " in done.stderr, done.stderr
            assert "XDG_RUNTIME_DIR" in done.stderr, done.stderr
    finally:
        subprocess.run(["rm", "-rf", "--", str(shared)], check=False)


def test_what_the_profile_and_project_file_make_a_command_use(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/nonexistent"}
    clusters = tmp_path / ".config" / "hpclaunch" / "clusters"
    clusters.mkdir(parents=True)
    (clusters / "mine.toml").write_text(
        'name = "mine"\nkind = "slurm"\n[remote]\nhost = "h"\nforward_env = ["HF_TOKEN"]\n'
        'ship_limit = "10M"\n'
    )
    found = forward.profile_remote(["run", "--cluster", "mine", "--", "p"], tmp_path, env)
    assert found.forward_env == ("HF_TOKEN",) and found.ship_limit == "10M"
    # A profile only the cluster knows: the defaults here (the cluster reads its own).
    only_there = forward.profile_remote(["run", "--cluster", "theirs"], tmp_path, env)
    assert only_there.forward_env == () and only_there.ship_limit == "2G"
    (tmp_path / "hpclaunch.toml").write_text(
        '[run]\nenv = ["DB_PASSWORD=x"]\n[sweep]\nwandb_sweep = "e/p/id"\n'
    )
    assert forward.project_names(["run"], tmp_path, env) == {"DB_PASSWORD"}
    assert forward.project_names(["sweep"], tmp_path, env) == {"DB_PASSWORD", "WANDB_API_KEY"}


def test_rsyncs_rules_delete_only_inside_git(tmp_path: Path) -> None:
    """ship._rules through the real rsync (a local copy, the transport aside): stale
    history in .git goes; what the cluster wrote (an output folder, a note, its own
    .env) stays; the laptop's ignored paths and credentials are not sent."""
    src, dst = tmp_path / "laptop", tmp_path / "cluster"
    for rel, text in {"a.py": "a", ".git/HEAD": "h", ".env": "laptop", "data/x": "d"}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    planted = {".git/objects/old/x": "s", "outputs/r.txt": "o", "notes.txt": "n", ".env": "c"}
    for rel, text in planted.items():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_text(text)
    rules = tmp_path / "rules"
    rules.write_text("\n".join(ship._rules(["data"])) + "\n")
    argv = ["rsync", "-a", "--delete", f"--filter=merge {rules}", f"{src}/", f"{dst}/"]
    subprocess.run(argv, check=True)
    left = sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file())
    assert left == [".env", ".git/HEAD", "a.py", "notes.txt", "outputs/r.txt"]
    assert (dst / ".env").read_text() == "c"


def test_laptop_options_without_remote_are_one_line(tmp_path: Path) -> None:
    for word in ("--ship", "--forward-env=HF_TOKEN"):
        done = subprocess.run(
            [sys.executable, "-m", "hpclaunch", "run", word, ".", "--dry-run", "--", "true"],
            cwd=tmp_path,
            env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "only with --remote HOST" in done.stderr, done.stderr


def test_prune_keeps_what_the_project_ignores_now(tmp_path: Path) -> None:
    mirror = tmp_path / "projects" / "demo-0123456789"
    mirror.mkdir(parents=True)
    git(mirror, "init", "-q")
    for rel in ("a.py", "results.csv", "old.py"):
        (mirror / rel).write_text(rel)
    assert ship.prune(mirror, ["a.py", "results.csv", "old.py"]) == 0
    (mirror / ".gitignore").write_text("results.csv\n")  # shipped with the next ship
    assert ship.prune(mirror, ["a.py", ".gitignore"]) == 1
    assert (mirror / "results.csv").is_file() and not (mirror / "old.py").exists()


def test_the_never_list_matches_any_component_as_fnmatch_would() -> None:
    import fnmatch

    paths = [".env", "a/.env.local", "x.pem", "keys/id_rsa.pub", "aws/credentials", "a.env"]
    paths += [".ssh/config", "src/key.py", ".envrc", "foo.keys", "x/.ssh", "credentials.json"]
    paths += ["xid_rsa", "a/b/.netrc", ".pypirc/x", ".gnupg", "d/.docker/c.json", ".aws/x"]
    for rel in paths:
        parts = rel.split("/")
        expected = any(
            fnmatch.fnmatchcase(part, p) for part in parts for p in snapshot.NEVER_SHIPPED
        )
        assert snapshot.never_shipped(rel) == expected, rel


class _LocalCluster:
    """ship()'s side of a Connection with the transport aside: rsync into a local
    folder standing for the remote home (`:PATH` is under it)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.host = type("H", (), {"name": "local"})()

    def rsync(self, args: list[str], make_dir: str = "") -> subprocess.CompletedProcess[str]:
        if make_dir:
            (self.home / make_dir).mkdir(parents=True, exist_ok=True)
        local = [f"{self.home}/{a[1:]}" if a.startswith(":") else a for a in args]
        return subprocess.run(["rsync", *local], capture_output=True, text=True, check=False)


def test_an_edit_in_the_same_second_at_the_same_size_is_shipped(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    git(root, "init", "-q")
    (root / "helper.py").write_text("VERSION = 1\n")
    (root / ".env").write_text("TOKEN=x\n")
    cluster = _LocalCluster(tmp_path / "home")
    first = ship.ship(cluster, root)  # type: ignore[arg-type]
    assert first.withheld == (".env",) and first.listed == ("helper.py",)
    mirror = cluster.home / first.mirror
    second = int(os.stat(root / "helper.py").st_mtime)
    (root / "helper.py").write_text("VERSION = 3\n")
    os.utime(root / "helper.py", ns=(second * 10**9 + 5 * 10**8,) * 2)  # same second
    os.utime(mirror / "helper.py", ns=(second * 10**9,) * 2)
    ship.ship(cluster, root)  # type: ignore[arg-type]
    assert (mirror / "helper.py").read_text() == "VERSION = 3\n"
    assert not (mirror / ".env").exists()
