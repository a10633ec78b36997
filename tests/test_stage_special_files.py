"""--stage of a FIFO, a device or a socket (the source itself, a symlink to one, or one
anywhere in a staged folder) is refused from its type alone, before anything is
opened: opening a FIFO blocks until a writer comes, and /dev/zero never ends. Files and
folders the user cannot read are named up front too, not found by tar while packing.

Every call runs in a thread with a time limit (or a subprocess with a timeout), and
open() of a special file fails the test, so a regression fails instead of hanging."""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from hpclaunch.errors import UserError
from hpclaunch.payload import stage

PROMPT_S = 10.0  # a refusal takes milliseconds; this only keeps a regression from hanging
REPO = Path(__file__).resolve().parents[1]
_REAL_OS_OPEN = os.open  # the guard below replaces os.open; _release needs the real one
TOP_LIMIT = "(only folders and regular files can be staged)"
TOP_FIX = "Stage a folder or a regular file instead (write the data to a file first)"
TREE_LIMIT = "(a staged folder may hold only folders, regular files and symlinks to them)"
TREE_FIX = "Remove {} or stage the folder's regular files only"


def _is_special(path: Any, dir_fd: Any = None) -> bool:
    if isinstance(path, int):
        return False
    try:
        mode = os.stat(path, dir_fd=dir_fd).st_mode
    except (OSError, TypeError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@pytest.fixture(autouse=True)
def _no_special_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """open() or os.open() of a FIFO, device or socket fails the test at once (the
    refusal must come from the file's type, never from reading it)."""
    real_open, real_os_open = builtins.open, os.open

    def guarded_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_special(file):
            raise AssertionError(f"opened the special file {file}")
        return real_open(file, *args, **kwargs)

    def guarded_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if _is_special(path, kwargs.get("dir_fd")):
            raise AssertionError(f"os.open() of the special file {path}")
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(os, "open", guarded_os_open)


def _release(fifos: Sequence[Path]) -> None:
    """Give each FIFO a writer that closes at once: a reader blocked in open() or read()
    then sees the end of the file, and its thread ends."""
    for fifo in fifos:
        with contextlib.suppress(OSError):
            os.close(_REAL_OS_OPEN(fifo, os.O_WRONLY | os.O_NONBLOCK))


def _outcome(call: Callable[[], object], fifos: Sequence[Path] = ()) -> UserError | None:
    """The UserError call() raised (None when it returned), within PROMPT_S seconds."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # whatever it was, the test's thread re-raises it
            raised.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(PROMPT_S)
    if thread.is_alive():
        _release(fifos)
        pytest.fail(f"still running after {PROMPT_S:.0f} s: it blocked on a special file")
    if not raised:
        return None
    if not isinstance(raised[0], UserError):
        raise raised[0]
    return raised[0]


def _refusal(call: Callable[[], object], fifos: Sequence[Path] = ()) -> UserError:
    err = _outcome(call, fifos)
    if err is None:
        pytest.fail("not refused")
    return err


def _plan(src: Path | str, tmp_path: Path) -> Callable[[], object]:
    return lambda: stage.plan_stage([str(src)], tmp_path, tmp_path / "runs")


def _socket(path: Path) -> None:
    """A socket file at path (bound, then closed: the file stays)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))


def _device(path: Path, kind: int) -> None:
    """A device node (major 1, minor 5: /dev/zero's numbers; never opened here)."""
    try:
        os.mknod(path, 0o600 | kind, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD (root); /dev/zero covers devices")


def _make(kind: str, path: Path, fifo: Path) -> str:
    """Make a special file of `kind` at path (a link-to-fifo kind links to `fifo`,
    made here); what the refusal calls it."""
    if kind == "fifo":
        os.mkfifo(path)
        return "a FIFO"
    if kind == "socket":
        _socket(path)
        return "a socket"
    if kind == "chardev":
        _device(path, stat.S_IFCHR)
        return "a character device"
    if kind == "blockdev":
        _device(path, stat.S_IFBLK)
        return "a block device"
    if kind == "link-to-zero":
        path.symlink_to("/dev/zero")
        return "a symlink to the character device /dev/zero"
    assert kind == "link-to-fifo"
    os.mkfifo(fifo)
    path.symlink_to(fifo)
    return f"a symlink to the FIFO {fifo}"


KINDS = ("fifo", "socket", "chardev", "blockdev", "link-to-zero", "link-to-fifo")


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_source_is_refused_from_its_type(tmp_path: Path, kind: str) -> None:
    src, fifo = tmp_path / "src", tmp_path / "target-fifo"
    what = _make(kind, src, fifo)
    err = _refusal(_plan(src, tmp_path), [src, fifo])
    assert str(err) == f"--stage: {src} is {what} {TOP_LIMIT}. {TOP_FIX}"
    assert err.field == "--stage"


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_source_is_refused(tmp_path: Path, device: str) -> None:
    err = _refusal(_plan(device, tmp_path))
    assert str(err) == f"--stage: {device} is a character device {TOP_LIMIT}. {TOP_FIX}"


def _tree(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "x.txt").write_text("x")
    (root / "top.txt").write_text("top")


@pytest.mark.parametrize("depth", ["top", "nested"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_holding_a_special_file_is_refused(tmp_path: Path, kind: str, depth: str) -> None:
    src, fifo = tmp_path / "data", tmp_path / "target-fifo"  # a linked FIFO: outside
    _tree(src)
    special = src / "odd" if depth == "top" else src / "a" / "b" / "odd"
    what = _make(kind, special, fifo)
    err = _refusal(_plan(src, tmp_path), [special, fifo])
    assert str(err) == (
        f"--stage: {src} holds a special file: {special} is {what} "
        f"{TREE_LIMIT}. {TREE_FIX.format('it')}"
    )


def test_several_special_files_are_named_first_few_then_how_many_more(tmp_path: Path) -> None:
    src = tmp_path / "data"
    _tree(src)
    for i in range(4):
        os.mkfifo(src / "a" / f"p{i}")
    _socket(src / "a" / "b" / "s")
    (src / "zero").symlink_to("/dev/zero")
    err = _refusal(_plan(src, tmp_path), [src / "a" / f"p{i}" for i in range(4)])
    assert str(err) == (
        f"--stage: {src} holds 6 special files: {src}/a/b/s is a socket, "
        f"{src}/a/p0 is a FIFO, {src}/a/p1 is a FIFO and 3 more "
        f"{TREE_LIMIT}. {TREE_FIX.format('them')}"
    )


def test_manifest_and_packing_refuse_a_special_file_that_came_later(tmp_path: Path) -> None:
    """Planned while clean, then a FIFO appears: hashing and packing list the tree
    again and refuse it, and no pack is left behind."""
    src = tmp_path / "data"
    _tree(src)
    items = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
    os.mkfifo(src / "a" / "late")
    err = _refusal(lambda: stage.manifest(str(src)), [src / "a" / "late"])
    assert f"{src}/a/late is a FIFO" in str(err)
    err = _refusal(lambda: stage.pack_all(items, io.StringIO()), [src / "a" / "late"])
    assert f"{src}/a/late is a FIFO" in str(err)
    assert not (tmp_path / "runs" / stage.CACHE).exists()


def test_symlinks_to_files_folders_or_nothing_are_still_packed_as_links(
    tmp_path: Path,
) -> None:
    """Symlinks keep their behaviour: stored as links (tar without -h), not refused."""
    src = tmp_path / "data"
    _tree(src)
    (src / "to-file").symlink_to("top.txt")
    (src / "to-dir").symlink_to("a")
    (src / "dangling").symlink_to("nowhere")
    (src / "loop").symlink_to("loop")
    [item] = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
    links = [rel for rel, *_ in stage.manifest(str(src)) if os.path.islink(src / rel)]
    assert links == ["dangling", "loop", "to-dir", "to-file"]
    stage.pack_all((item,), io.StringIO())
    assert len(stage.parts(item.archive)) == 2


# --- files and folders the user cannot read ------------------------------------------

_PLAN_AS_USER = """
import sys
from pathlib import Path
from hpclaunch.payload import stage
from hpclaunch.errors import UserError
try:
    stage.plan_stage([sys.argv[1]], Path(sys.argv[2]), Path(sys.argv[2]) / "runs")
except UserError as exc:
    print(exc)
else:
    print("planned")
"""


def _unprivileged() -> pwd.struct_passwd:
    for name in ("hpcuser", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    pytest.skip("root reads every file, and there is no unprivileged user to test as")


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder another user can enter (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="hpclaunch-unreadable-"))
    folder.chmod(0o755)
    yield folder
    for path in (folder, *folder.rglob("*")):
        path.chmod(0o755)
    shutil.rmtree(folder)


def _planned_line(src: Path, cwd: Path, modes: Sequence[tuple[Path, int]]) -> str:
    """Set the modes, then stage.plan_stage's refusal (or 'planned') as the user it is
    about: an unprivileged user who owns the tree when this runs as root (permission
    bits do not stop root); the modes are put back after."""
    user = _unprivileged() if os.geteuid() == 0 else None
    if user is not None:
        for path in (cwd, *cwd.rglob("*")):
            os.lchown(path, user.pw_uid, user.pw_gid)
    for path, mode in modes:
        path.chmod(mode)
    try:
        if user is None:
            err = _outcome(lambda: stage.plan_stage([str(src)], cwd, cwd / "runs"))
            return "planned" if err is None else str(err)
        done = subprocess.run(
            [sys.executable, "-c", _PLAN_AS_USER, str(src), str(cwd)],
            user=user.pw_uid, group=user.pw_gid, extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "src"),
                 "PYTHONDONTWRITEBYTECODE": "1"},
            cwd=cwd, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()
    finally:
        for path, _ in modes:
            path.chmod(0o755)


def test_unreadable_files_and_folders_are_named_before_packing(shared_tmp: Path) -> None:
    src = shared_tmp / "data"
    _tree(src)
    (src / "a-locked").mkdir()
    (src / "a-locked" / "hidden.txt").write_text("h")
    (src / "listable").mkdir()  # its names can be read, its entries not reached
    (src / "listable" / "f").write_text("f")
    for i in range(4):
        (src / "a" / f"secret{i}.bin").write_bytes(b"s")
    modes = [(src / "a-locked", 0o000), (src / "listable", 0o600)]
    modes += [(src / "a" / f"secret{i}.bin", 0o000) for i in range(4)]
    assert _planned_line(src, shared_tmp, modes) == (
        f"--stage: {src} holds 6 entries you cannot read: {src}/a-locked/, "
        f"{src}/a/secret0.bin, {src}/a/secret1.bin and 3 more (every file and folder "
        "of a staged folder must be readable by you). Make them readable (chmod u+rX) "
        "or remove them"
    )


def test_one_unreadable_file_and_an_unreadable_source(shared_tmp: Path) -> None:
    src = shared_tmp / "data"
    _tree(src)
    assert _planned_line(src, shared_tmp, [(src / "a" / "b" / "x.txt", 0o000)]) == (
        f"--stage: {src} holds an entry you cannot read: {src}/a/b/x.txt (every file and "
        "folder of a staged folder must be readable by you). Make it readable (chmod u+rX) "
        "or remove it"
    )
    archive = shared_tmp / "data.tar"  # an archive is not opened while planning
    archive.write_bytes(b"")
    for source in (archive, src):
        assert _planned_line(source, shared_tmp, [(source, 0o000)]) == (
            f"--stage: cannot read {source}: Permission denied. "
            "Make it readable (chmod u+rX) or stage something else"
        )
    assert _planned_line(src, shared_tmp, []) == "planned"


def test_root_reads_everything_so_root_is_not_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root reads a file whose mode is 000")
    src = tmp_path / "data"
    _tree(src)
    (src / "top.txt").chmod(0o000)
    [item] = stage.plan_stage(["data"], tmp_path, tmp_path / "runs")
    assert item.size == 4


# --- the command line -------------------------------------------------------------------


def test_cli_dry_run_of_a_fifo_exits_2_with_one_line_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    env = {
        "PATH": f"{REPO / '.venv' / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "LANG": "C.UTF-8",
    }
    argv = [str(REPO / ".venv" / "bin" / "hpclaunch"), "run", "--cluster", "local",
            "--dry-run", "--stage", str(fifo), "--", "python3", "-c", "pass"]  # fmt: skip
    try:
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=20, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("hpclaunch run --dry-run --stage FIFO blocked (killed after 20 s)")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr == f"hpclaunch: error: --stage: {fifo} is a FIFO {TOP_LIMIT}. {TOP_FIX}\n"
    assert not (tmp_path / "runs").exists()
