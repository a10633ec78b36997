"""Issue 33 on the testbed's two nodes: a Charliecloud SquashFS image file given to
--container is read from the shared file system once (sbcast, then each node's ch-run
reads its node-local copy) and once per node where sbcast is refused. The bytes read from
the shared image are counted with strace on every process that reads it (`sbcast` and
`ch-run` of the job's PATH run the real ones under `strace -f -y`, tests/test_e2e_venvpack).
As root: ch-run mounts a SquashFS image through FUSE, and the testbed's /dev/fuse is
root's only (no setuid fusermount), as in test_e2e_venvpack's squashfuse test."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import testbed
from conftest import Hpc
from test_e2e_venvpack import READ, _bytes_read, _wrap
from test_e2e_venvpack import root as root

pytestmark = pytest.mark.testbed

IMAGES = testbed.state_dir() / "images"
PROGRAM = (
    "import hashlib, os, sys; exe = os.path.realpath(sys.executable); print('SUM', "
    "os.environ['SLURMD_NODENAME'], exe, hashlib.sha256(open(exe, 'rb').read()).hexdigest())"
)


def _image(hpc: Hpc) -> Path:
    """The testbed's Python image as a SquashFS file that has the test folder (ch-run
    binds it and cannot make mount points in a read-only image)."""
    image = hpc.cwd / "image.sqfs"
    parts = hpc.cwd.relative_to("/").parts
    made = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    pseudo = [f"{d} d 755 0 0" for d in made if not (IMAGES / "debian-python" / d).exists()]
    subprocess.run(
        ["mksquashfs", str(IMAGES / "debian-python"), str(image), "-noappend", "-no-progress",
         "-quiet", "-comp", "lz4", *(a for p in pseudo for a in ("-p", p))],
        check=True, timeout=300, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    os.chown(image, hpc.cwd.stat().st_uid, hpc.cwd.stat().st_gid)
    return image


def _broadcast_always(hpc: Hpc) -> None:
    """The testbed has 2 nodes: below the default image_broadcast_min_nodes (8)."""
    (hpc.cwd / "hpclaunch.toml").write_text("[clusters.slurm]\nimage_broadcast_min_nodes = 2\n")


def _broadcast_image(hpc: Hpc) -> Path:
    """The image file of :func:`_image`, broadcast on the testbed's 2 nodes; skips where
    the nodes share one /tmp or the testbed has no image."""
    if testbed.layout() != "netns":
        pytest.skip("the nodes share one /tmp here: a copy per node cannot be told apart")
    if not (IMAGES / "debian-python").is_dir():
        pytest.skip("the testbed has no debian-python image")
    image = _image(hpc)
    _broadcast_always(hpc)
    return image


def _read_by(traces: list[Path], path_part: str) -> int:
    """Bytes read (read/pread64) from files whose path holds `path_part`."""
    total = 0
    for trace in traces:
        for line in trace.read_text(errors="replace").splitlines():
            match = READ.match(line)
            if match and path_part in match.group(1):
                total += int(match.group(2))
    return total


def _no_copies_left(hpc: Hpc) -> None:
    """No copy a run's broadcast.json names (a refused one's partial too) is on a node."""
    names = set()
    for run_dir in hpc.run_dirs():
        sent = json.loads((run_dir / "broadcast.json").read_text())
        names |= {os.path.basename(copy) for copy in sent.values()}
    assert names or hpc.run_dirs() == []
    for node in ("node1", "node2"):
        left = sorted(names & set(testbed.node_tmp(node)))
        assert left == [], (node, left)


def test_a_charliecloud_image_file_is_read_once_with_sbcast_and_once_per_node_without(
    root: Hpc,
) -> None:
    hpc = root
    image = _broadcast_image(hpc)
    size = image.stat().st_size
    for how in ("broadcast", "per-node"):
        traces = hpc.folder(f"traces-{how}")
        wrappers = hpc.folder(f"bin-{how}")
        _wrap(wrappers, "ch-run", traces, "read,pread64,mmap")
        _wrap(wrappers, "sbcast", traces, "read,pread64,mmap")
        if how == "per-node":  # a site that refuses sbcast
            (wrappers / "sbcast").write_text(
                "#!/bin/sh\necho 'sbcast: error: refused' >&2\nexit 1\n"
            )
        path = {"PATH": f"{wrappers}:{hpc.env['PATH']}"}
        proc = hpc.run("run", "-N", "2", "--wait", "--container", str(image),
                       "--container-runtime", "charliecloud", "--", "python3", "-c", PROGRAM,
                       env=path, timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        sums = sorted(line.split("SUM ")[1] for line in proc.stdout.splitlines() if "SUM " in line)
        exe = sums[0].split()[1] if sums else ""
        want = hashlib.sha256((IMAGES / "debian-python" / exe.lstrip("/")).read_bytes())
        assert sums == [f"node1 {exe} {want.hexdigest()}", f"node2 {exe} {want.hexdigest()}"]
        chrun = sorted(traces.glob("ch-run.*"))
        assert {t.name.split(".")[1] for t in chrun} == {"node1", "node2"}, chrun
        shared = _bytes_read(sorted(traces.iterdir()), image)
        by_chrun = [_bytes_read([t], image) for t in chrun]
        copies = [_read_by([t], "/hpclaunch-bcast-") for t in chrun]
        if how == "broadcast":  # sbcast's one read; the ranks read their node's copy
            assert shared == size and by_chrun == [0, 0] and all(copies), (shared, size, copies)
        else:  # each node's ch-run reads the shared image
            assert all(by_chrun) and copies == [0, 0], (by_chrun, copies)
        print(f"{how}: {shared} bytes read from the shared image ({size} bytes), per ch-run "
              f"{by_chrun}, from node-local copies {copies}")  # fmt: skip
        _no_copies_left(hpc)
    notes = [p.read_text() for p in hpc.cwd.glob("**/logs/batch.out")]
    assert sum("hpclaunch: note: sbcast of" in text for text in notes) == 1, notes


def test_with_stage_the_guards_remove_the_image_copy(root: Hpc) -> None:
    image = _broadcast_image(root)
    (root.cwd / "blob").write_bytes(b"data")
    program = "import os; print('DATA', open(os.environ['HPCLAUNCH_DATA']).read())"
    proc = root.run("run", "-N", "2", "--wait", "--container", str(image),
                    "--container-runtime", "charliecloud", "--stage", str(root.cwd / "blob"),
                    "--", "python3", "-c", program, timeout=300)  # fmt: skip
    assert proc.returncode == 0, root.evidence(proc)
    # CI once saw rank 1's line alone (a COMPLETED job, exit code 0): the evidence says
    # which rank files and events there were, should it happen again.
    assert proc.stdout.count("DATA data") == 2, root.evidence(proc)
    [run_dir] = root.run_dirs()
    assert len(json.loads((run_dir / "broadcast.json").read_text())) == 2  # blob and image
    _no_copies_left(root)


def test_clean_removes_the_image_copies_of_a_cancelled_job(root: Hpc) -> None:
    """Without --stage a cancelled job never reaches its drop step: its copies stay in the
    nodes' /tmp until `hpclaunch clean` (or the next staging step) sees squeue no longer
    lists the job. Only this job's copies (broadcast.json's names) are checked: other
    tests' jobs run on the same nodes meanwhile."""
    image = _broadcast_image(root)
    program = "import time; print('UP', flush=True); time.sleep(300)"
    proc = root.run("run", "-N", "2", "--json", "--container", str(image), "--container-runtime",
                    "charliecloud", "--", "python3", "-c", program)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job_id, run_dir = json.loads(proc.stdout)["job_id"], Path(json.loads(proc.stdout)["run_dir"])
    # The job runs with its copy on both nodes (not its ranks: ch-run 0.31 once hung on a
    # loaded testbed, stat'ing its own SquashFUSE mount before serving it, fuse_do_getattr).
    deadline = time.monotonic() + 180
    names: set[str] = set()
    while not names or not all(names <= set(testbed.node_tmp(n)) for n in ("node1", "node2")):
        assert time.monotonic() < deadline, "the job's image copies never reached both nodes"
        time.sleep(0.5)
        sent = run_dir / "broadcast.json"
        if sent.exists():
            names = {os.path.basename(c) for c in json.loads(sent.read_text()).values()}
    assert len(names) == 1, names  # the image's copy, one name on every node
    assert root.run("cancel", job_id).returncode == 0
    while root.cmd(["squeue", "-h", "-j", job_id]).stdout.strip():
        assert time.monotonic() < deadline + 120, "the cancelled job stays in squeue"
        time.sleep(0.5)
    for node in ("node1", "node2"):  # the defect: nothing removed them
        assert names <= set(testbed.node_tmp(node)), node
    clean = root.cmd(
        ["srun", "-N2", "--ntasks-per-node=1", "hpclaunch", "clean", "--folder", "/tmp"]
    )
    assert clean.returncode == 0, clean.stdout + clean.stderr
    for node in ("node1", "node2"):
        assert not names & set(testbed.node_tmp(node)), (node, clean.stdout)
