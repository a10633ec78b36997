"""A project file is read only when it is the user's (issue 24, item 3), in process.

These run as root, which is "the user" here: files are handed to another uid (the
testbed's second user when it exists) to stand for one planted by a neighbour. The same
cases run as the real users in tests/test_e2e_project_trust.py.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from hpclaunch.config import layering, projectfile, userconfig
from hpclaunch.errors import UserError
from hpclaunch.planning import preparing
from hpclaunch.remote import choose

PLANTED = '[run]\nexp = "planted"\nsetup = ["touch /tmp/pwned"]\n'


def _other_uid() -> int:
    try:
        return pwd.getpwnam("hpcother").pw_uid
    except KeyError:
        return 4242  # no such user: as foreign as one


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {
        "USER": "alice",
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "HPCLAUNCH_CLUSTER": "local",
    }


def _prepare(cwd: Path, env: dict[str, str]) -> preparing.Prepared:
    return preparing.prepare_spec({}, ("python", "train.py"), cwd, env)


def _write(path: Path, text: str, mode: int = 0o644, uid: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    if uid is not None:
        os.chown(path, uid, -1)
    return path


def _user_config(env: dict[str, str], text: str, mode: int = 0o600) -> Path:
    return _write(Path(env["XDG_CONFIG_HOME"]) / "hpclaunch" / "config.toml", text, mode)


def _warned(prepared: preparing.Prepared, *words: str) -> bool:
    return any(all(w in line for w in words) for line in prepared.warnings)


def test_search_ends_at_the_git_root_and_at_home(tmp_path: Path, env: dict[str, str]) -> None:
    repo = tmp_path / "repo"
    sub = repo / "a" / "b"
    sub.mkdir(parents=True)
    (repo / ".git").mkdir()
    assert projectfile.search_folders(sub, env) == ([sub, repo / "a", repo], [])
    # A work tree above $HOME: the search stops at $HOME.
    home = repo / "a"
    assert projectfile.search_folders(sub, {**env, "HOME": str(home)})[0] == [sub, home]
    # Outside git: only the working folder is read; parents up to $HOME are noted.
    plain = Path(env["HOME"]) / "x" / "y"
    plain.mkdir(parents=True)
    read, noted = projectfile.search_folders(plain, env)
    assert read == [plain] and noted == [plain.parent, Path(env["HOME"])]


def test_a_parent_folders_file_outside_git_is_not_read(tmp_path: Path, env: dict[str, str]) -> None:
    scratch = tmp_path / "scratch"
    _write(scratch / "hpclaunch.toml", PLANTED, uid=_other_uid())
    (scratch / "mine").mkdir()
    prepared = _prepare(scratch / "mine", env)
    assert prepared.project_file is None
    assert prepared.spec.exp != "planted" and not prepared.spec.setup
    assert _warned(prepared, f"not reading {scratch / 'hpclaunch.toml'}", "outside a git")


def test_a_file_of_another_user_in_the_git_root_is_ignored(
    tmp_path: Path, env: dict[str, str]
) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    planted = _write(repo / "hpclaunch.toml", PLANTED, uid=_other_uid())
    (repo / "src").mkdir()
    prepared = _prepare(repo / "src", env)
    assert prepared.project_file is None and not prepared.spec.setup
    assert _warned(prepared, f"ignoring {planted}", "owned by", "safe_project_files")
    # Listed in the user's own config (a team's shared file): read, and said so.
    _user_config(env, f'safe_project_files = ["{planted}"]\n')
    prepared = _prepare(repo / "src", env)
    assert prepared.project_file == planted and prepared.spec.exp == "planted"
    assert f"hpclaunch: project file: {planted}" in prepared.warnings


def test_a_group_writable_file_is_ignored_until_fixed(tmp_path: Path, env: dict[str, str]) -> None:
    mine = _write(tmp_path / "hpclaunch.toml", PLANTED, mode=0o664)
    prepared = _prepare(tmp_path, env)
    assert prepared.project_file is None and not prepared.spec.setup
    assert _warned(prepared, f"ignoring {mine}", "writable by its group (mode 0664)")
    assert _warned(prepared, f"Fix: chmod go-w {mine}, or if others must edit it, add it")
    mine.chmod(0o644)
    assert _prepare(tmp_path, env).project_file == mine


def test_the_users_config_must_be_the_users(tmp_path: Path, env: dict[str, str]) -> None:
    planted = _write(tmp_path / "hpclaunch.toml", PLANTED, uid=_other_uid())
    path = _user_config(env, f'safe_project_files = ["{planted}"]\n', mode=0o666)
    loaded = userconfig.load(env)
    assert loaded.safe_project_files == () and "writable by group and others" in loaded.warnings[0]
    prepared = _prepare(tmp_path, env)
    assert prepared.project_file is None
    assert _warned(prepared, f"ignoring {path}")
    path.chmod(0o600)
    assert userconfig.load(env).safe_project_files == (planted,)


def test_the_users_config_keys_are_checked(env: dict[str, str]) -> None:
    _user_config(env, 'safe_project_file = ["/x"]\n')
    with pytest.raises(UserError, match="safe_project_file: unknown key"):
        userconfig.load(env)
    _user_config(env, 'safe_project_files = ["rel/x"]\n')
    with pytest.raises(UserError, match="not an absolute path"):
        userconfig.load(env)
    _user_config(env, 'remote_hosts = "lumi"\n')
    with pytest.raises(UserError, match="not a list of strings"):
        userconfig.load(env)


def test_a_planted_folder_is_ignored_not_an_error(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / ".git").mkdir()
    planted = tmp_path / "hpclaunch.toml"
    planted.mkdir()
    os.chown(planted, _other_uid(), -1)
    prepared = _prepare(tmp_path, env)
    assert prepared.project_file is None and _warned(prepared, f"ignoring {planted}")


REMOTE = '[run]\ncluster = "evil"\n[clusters.evil]\nkind = "slurm"\n[clusters.evil.remote]\nhost = "planted.invalid"\n'  # noqa: E501


def test_a_project_files_remote_host_needs_the_users_word(
    tmp_path: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / ".git").mkdir()
    _write(tmp_path / "hpclaunch.toml", REMOTE)  # the user's own file, say from a clone
    projectfile._TOLD.clear()
    # A laptop: no sbatch on PATH, so a profile's [remote] host would be used.
    env = {**{k: v for k, v in env.items() if k != "HPCLAUNCH_CLUSTER"}, "PATH": env["HOME"]}
    assert choose.choose(["runs"], tmp_path, env) is None  # no ssh to planted.invalid
    err = capsys.readouterr().err
    assert "ignoring [clusters.evil.remote] host = 'planted.invalid'" in err
    assert 'remote_hosts = ["planted.invalid"]' in err
    assert err.count("\n") == 1
    assert layering.project_tables(tmp_path, env)[1]["evil"]["remote"] == {}
    # The user's own profile of that cluster names the same host: taken.
    profile = Path(env["XDG_CONFIG_HOME"]) / "hpclaunch/clusters/evil.toml"
    _write(profile, '[remote]\nhost = "planted.invalid"\n')
    found = choose.choose(["runs"], tmp_path, env)
    assert found is not None and found.host == "planted.invalid"
    # Or the user's config lists it.
    profile.unlink()
    _user_config(env, 'remote_hosts = ["planted.invalid"]\n')
    found = choose.choose(["runs"], tmp_path, env)
    assert found is not None and found.host == "planted.invalid"


def test_the_cli_says_each_warning_once(tmp_path: Path, env: dict[str, str]) -> None:
    """choose() says them before the command; the run's own notes leave them out."""
    projectfile._TOLD.clear()
    _write(tmp_path / "hpclaunch.toml", PLANTED, mode=0o666)
    found = projectfile.find(tmp_path, env)
    projectfile.tell(found.warnings)
    assert not any("ignoring" in line for line in _prepare(tmp_path, env).warnings)
    projectfile._TOLD.clear()


def test_hpclaunch_config_names_a_file_that_obeys_the_same_rule(
    tmp_path: Path, env: dict[str, str]
) -> None:
    planted = _write(tmp_path / "team.toml", PLANTED, uid=_other_uid())
    prepared = _prepare(tmp_path, {**env, "HPCLAUNCH_CONFIG": str(planted)})
    assert prepared.project_file is None and _warned(prepared, f"ignoring {planted}")
