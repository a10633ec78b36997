"""Issue 33 on the testbed's two nodes: a packed venv (`hpclaunch env pack`) imported by
2 ranks on 2 nodes, through squashfuse without a container (as root: the testbed has no
setuid fusermount) and inside the Charliecloud image; the file-system calls on the venv
counted with strace; and broadcast staging, the bytes read from the shared copy counted
with strace on every process that reads it (a `tar`/`sbcast`/`squashfuse` of the job's
PATH that runs the real one under `strace -f -y`)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import testbed
from conftest import Hpc, _user_folder

pytestmark = pytest.mark.testbed

MODULES = 150  # a package of many small modules, as real venvs have thousands of files
IMPORT = (
    "import os, sys, manymods; print('IMPORTED', os.environ['RANK'], sys.prefix, manymods.N, "
    "[l.split()[2] for l in open('/proc/self/mounts') if l.split()[1] == sys.prefix])"
)
READ = re.compile(r"^(?:\d+ +)?p?read(?:64)?\(\d+<([^>]*)>, .*\) = (\d+)$")
# sbcast maps the whole file and sends it: the mapped length is what it reads.
MMAP = re.compile(r"^(?:\d+ +)?mmap\([^,]+, (\d+), [^,]+, [^,]+, \d+<([^>]*)>, ")


@pytest.fixture
def root(slurm_conf: Path) -> Iterator[Hpc]:
    """A fresh shared folder of root's: squashfuse needs root here (no fusermount)."""
    yield from _user_folder(slurm_conf, "root", False)


def _venv(where: Path, python: str = "/usr/bin/python3") -> Path:
    subprocess.run([python, "-m", "venv", "--without-pip", str(where)], check=True)
    site = next(where.glob("lib/python3*/site-packages"))
    package = site / "manymods"
    package.mkdir()
    for n in range(MODULES):
        (package / f"m{n}.py").write_text(f"X = {n}\n")
    imports = "".join(f"from . import m{n}\n" for n in range(MODULES))
    (package / "__init__.py").write_text(imports + f"N = {MODULES}\n")
    return where


def _wrap(folder: Path, tool: str, trace: Path, calls: str) -> None:
    """folder/tool: the real tool run under strace -f -y, one trace per process."""
    folder.mkdir(exist_ok=True)
    real = subprocess.run(["which", tool], capture_output=True, text=True, check=True).stdout
    script = (
        f'#!/bin/sh\nexec strace -f -qq -y -e trace={calls} -o "{trace}/{tool}.$(hostname).$$" '
        f'{real.strip()} "$@"\n'
    )
    (folder / tool).write_text(script)
    (folder / tool).chmod(0o755)


def _imported(proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sorted(
        line.split("IMPORTED ")[1] for line in proc.stdout.splitlines() if "IMPORTED" in line
    )


def _calls_under(traces: list[Path], folder: Path) -> int:
    needle = str(folder) + "/"
    return sum(t.read_text(errors="replace").count(needle) for t in traces)


def test_ranks_on_two_nodes_import_from_a_packed_venv_through_squashfuse(root: Hpc) -> None:
    plain = _venv(root.cwd / "plain")
    packed = _venv(root.cwd / "packed")
    done = root.run("env", "pack", str(packed))
    assert done.returncode == 0, done.stderr
    image = root.cwd / "packed.sqsh"
    traces = root.cwd / "traces"
    traces.mkdir()
    # The plain venv: every rank's imports are calls on the shared folder.
    strace = ["strace", "-f", "-qq", "-e", "trace=%file", "-o", f"{traces}/plain.{{rank}}"]
    proc = root.run("run", "-N", "2", "--wait", "--venv", str(plain), "--", *strace,
                    "python", "-c", IMPORT)  # fmt: skip
    assert _imported(proc) == [f"0 {plain} {MODULES} []", f"1 {plain} {MODULES} []"]
    plain_calls = _calls_under(sorted(traces.glob("plain.*")), plain)
    assert plain_calls >= 2 * 3 * MODULES, plain_calls  # hundreds: stat, open, read per module
    # The packed venv: only the image is left on the shared file system; each node mounts
    # it at the venv's path (squashfuse, traced), so the ranks' calls go to that mount.
    subprocess.run(["rm", "-rf", str(packed)], check=True)
    wrappers = root.cwd / "bin"
    _wrap(wrappers, "squashfuse", traces, "%file,read,pread64")
    path = {"PATH": f"{wrappers}:{root.env['PATH']}"}
    strace[-1] = f"{traces}/packed.{{rank}}"
    proc = root.run("run", "-N", "2", "--wait", "--venv", str(image), "--", *strace,
                    "python", "-c", IMPORT, env=path)  # fmt: skip
    assert _imported(proc) == [
        f"0 {packed} {MODULES} ['fuse.squashfuse']",
        f"1 {packed} {MODULES} ['fuse.squashfuse']",
    ]
    fuse = sorted(traces.glob("squashfuse.*"))
    assert len(fuse) == 2  # one squashfuse per node, on both nodes
    # What reached the shared file system: squashfuse's calls, none on the venv's folder
    # but the mount itself; it opened one file there, the image (or its sbcast copy).
    text = "".join(t.read_text(errors="replace") for t in fuse)
    on_venv = [line for line in text.splitlines() if str(packed) + "/" in line]
    assert on_venv == [], on_venv[:5]
    opened = set(re.findall(r'open(?:at)?\([^"]*"([^"]+)"', text))
    mine = {p for p in opened if p.startswith(str(root.cwd)) or "hpclaunch-bcast-" in p}
    assert len(mine) <= 1 and all(p == str(image) or "hpclaunch-bcast-" in p for p in mine)
    print(f"plain venv: {plain_calls} calls on its folder; packed: 0 (opened: {sorted(mine)})")


def test_a_packed_venv_inside_the_charliecloud_image(
    root: Hpc, user_image: Path, wheel_dir: Path
) -> None:
    req = root.cwd / "req.txt"
    req.write_text(f"--no-index\n--find-links {wheel_dir}\npkgd\n")
    venv = root.cwd / "venv"
    ch = ("--container", str(user_image), "--container-runtime", "charliecloud")
    made = root.run("env", "create", *ch, "-r", str(req), str(venv), timeout=300)
    assert made.returncode == 0, made.stderr
    assert root.run("env", "pack", str(venv)).returncode == 0
    subprocess.run(["rm", "-rf", str(venv)], check=True)  # the nodes mount the image
    program = "import sys, pkga, pkgd; print('IMPORTED', sys.prefix, pkga.__version__)"
    proc = root.run("run", "-N", "2", "--wait", *ch, "--venv", f"{venv}.sqsh", "--",
                    "python3", "-c", program)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = [line for line in proc.stdout.splitlines() if "IMPORTED" in line]
    assert len(seen) == 2 and all(line.endswith(f"IMPORTED {venv} 1.0") for line in seen), seen
    # The venv guard holds: the same packed venv for another image is refused.
    other = root.run("run", "--container", "/var/tmp/hpclaunch-testbed/images/debian-python",
                     "--container-runtime", "charliecloud", "--venv", f"{venv}.sqsh", "--",
                     "true")  # fmt: skip
    assert other.returncode == 2 and "was made for" in other.stderr, other.stderr


def _bytes_read(traces: list[Path], shared: Path) -> int:
    total = 0
    for trace in traces:
        for line in trace.read_text(errors="replace").splitlines():
            match = READ.match(line)
            if match and match.group(1) == str(shared):
                total += int(match.group(2))
            mapped = MMAP.match(line)
            if mapped and mapped.group(2) == str(shared):
                total += int(mapped.group(1))
    return total


def test_a_staged_archive_is_read_once_with_sbcast_and_once_per_node_without(hpc: Hpc) -> None:
    if testbed.layout() != "netns":
        pytest.skip("the nodes share one /tmp here: a copy per node cannot be told apart")
    blob = os.urandom(3 * 2**20)
    data = hpc.folder("data")
    (data / "blob").write_bytes(blob)
    archive = hpc.cwd / "ball.tar"
    subprocess.run(["tar", "-cf", str(archive), "-C", str(data), "blob"], check=True)
    os.chown(archive, *(hpc.cwd.stat().st_uid, hpc.cwd.stat().st_gid))
    program = (
        "import hashlib, os; print('SUM', os.environ['SLURMD_NODENAME'], hashlib.sha256("
        "open(os.environ['HPCLAUNCH_DATA'] + '/blob', 'rb').read()).hexdigest())"
    )
    want = hashlib.sha256(blob).hexdigest()
    size = archive.stat().st_size
    for how, readers in (("broadcast", 1), ("per-node", 2)):
        traces = hpc.folder(f"traces-{how}")
        wrappers = hpc.folder(f"bin-{how}")
        _wrap(wrappers, "tar", traces, "read,pread64,mmap")
        _wrap(wrappers, "sbcast", traces, "read,pread64,mmap")
        if how == "per-node":  # a site that refuses sbcast
            (wrappers / "sbcast").write_text(
                "#!/bin/sh\necho 'sbcast: error: refused' >&2\nexit 1\n"
            )
        path = {"PATH": f"{wrappers}:{hpc.env['PATH']}"}
        proc = hpc.run("run", "-N", "2", "--wait", "--stage", str(archive), "--", "python3",
                       "-c", program, env=path)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        sums = sorted(line.split("SUM ")[1] for line in proc.stdout.splitlines() if "SUM " in line)
        assert sums == [f"node1 {want}", f"node2 {want}"], sums
        read = _bytes_read(sorted(traces.iterdir()), archive)
        assert read == readers * size, (how, read, size)
        print(f"{how}: {read} bytes read from the shared copy ({size} bytes)")
    notes = [p.read_text() for p in hpc.cwd.glob("**/logs/batch.out")]
    assert sum("hpclaunch: note: sbcast of" in text for text in notes) == 1, notes
