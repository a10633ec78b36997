"""--stage / --stage-out on the testbed: data on every node once, from each node's own
copy; the node-local folder gone after success, failure, scancel and the time limit;
leftovers of dead jobs removed by the next staging step; capacity refused up front.

Each testbed node has a private /tmp, so what is on a node is looked at by a Slurm step
on that node (`srun -N2 --ntasks-per-node=1`), as the issue's acceptance asks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import testbed
from conftest import PROGRAMS, Hpc

pytestmark = pytest.mark.testbed


def _dataset(root: Path, files: int = 5000, per_dir: int = 100) -> dict[str, str]:
    """files small files in nested folders; returns {relative path: sha256}."""
    sums: dict[str, str] = {}
    for i in range(files):
        rel = f"d{i // per_dir:03d}/sub{i % 3}/f{i:05d}.bin"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = hashlib.sha256(str(i).encode()).digest() * (1 + i % 5)
        path.write_bytes(data)
        sums[rel] = hashlib.sha256(data).hexdigest()
    return sums


def _chown_tree(hpc: Hpc, root: Path) -> None:
    info = hpc.cwd.stat()
    for path in (root, *root.rglob("*")):
        os.chown(path, info.st_uid, info.st_gid)


def _on_nodes(command: str, as_root: bool = False) -> dict[str, str]:
    """Run `command` once on every node (a Slurm step); {node: its output on one line}."""
    script = f'out=$({command}); echo "$SLURMD_NODENAME" $out'  # one line per task
    argv = ["srun", "-N2", "--ntasks-per-node=1", "bash", "-c", script]
    if as_root:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "SLURM_CONF": str(testbed.conf_path()),
                 "PATH": f"{os.environ['PATH']}:/usr/sbin:/sbin"},
            cwd="/",
        )  # fmt: skip
    else:
        proc = testbed.run_as_user(argv, cwd=testbed.work_dir(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return {line.split()[0]: line.partition(" ")[2] for line in proc.stdout.splitlines() if line}


def _locals_on_nodes(hpc: Hpc | None = None) -> dict[str, list[str]]:
    """The node-local folders (hpclaunch-<jobid>[-a<N>].<random>, src/hpclaunch/node) on
    each node's /tmp; with ``hpc``, only those of that test's jobs: the testbed's cores are
    shared (OverSubscribe=FORCE), so other tests' jobs run on the same nodes meanwhile and
    their folders (and a W&B agent's hpclaunch-wandb-*) come and go beside them."""
    listing = _on_nodes("ls -1 /tmp")
    own = None if hpc is None else _job_ids_of(hpc)
    return {
        node: sorted(
            n
            for n in text.split()
            if n.startswith("hpclaunch-") and (own is None or _local_job_id(n) in own)
        )
        for node, text in listing.items()
    }


def _local_job_id(name: str) -> str:
    """hpclaunch-123-a1.x7Yz -> 123 (the job id of a node-local folder's name)."""
    return name[len("hpclaunch-") :].split(".")[0].split("-")[0].split("_")[0]


def _job_ids_of(hpc: Hpc) -> set[str]:
    """The Slurm job ids of every run under the test's folder (their run.json files)."""
    found = set()
    for record in hpc.cwd.rglob("run.json"):
        job_id = str(json.loads(record.read_text()).get("job_id") or "")
        if job_id:
            found.add(job_id.split("_")[0])
    return found


def _sums_program(hpc: Hpc) -> Path:
    """The checker program, copied where the ranks can read it."""
    return Path(shutil.copy(PROGRAMS / "data_sums.py", hpc.cwd / "sums.py"))


def _tar_of(hpc: Hpc) -> list[Path]:
    """The packs of the dataset (each a folder of tars)."""
    return sorted((hpc.cwd / "runs" / ".stage-cache").glob("DATASET-*"))


@pytest.mark.serial  # waits for an idle cluster; reads the nodes' /tmp
def test_dataset_reaches_every_rank_from_its_own_node(hpc: Hpc) -> None:
    sums = _dataset(hpc.cwd / "dataset")
    _chown_tree(hpc, hpc.cwd / "dataset")
    out = hpc.folder("out")
    program = _sums_program(hpc)
    args = ("-N", "2", "--tasks-per-node", "2", "--wait", "--stage", "dataset")
    proc = hpc.run("run", *args, "--", "python3", str(program), str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("sums-*.json"))]
    assert len(reports) == 4
    # One guard per node, not one per rank (srun would take the job's SLURM_NTASKS).
    batch = (hpc.run_dirs()[0] / "logs" / "batch.out").read_text()
    assert "Ignoring --ntasks-per-node" not in batch, batch
    for report in reports:
        assert report["sums"] == sums, report["node"]
        assert report["root"] == f"{report['local']}/data/DATASET" == report["data"]
        assert report["local"].startswith("/tmp/hpclaunch-")  # hpclaunch-<job>.<random>
        assert report["root"].startswith("/tmp/")
    if testbed.layout() == "netns":
        assert {r["node"] for r in reports} == {"node1", "node2"}
        assert {r["tmp_fs"] for r in reports} == {"tmpfs"}  # each node's own /tmp
    [tar] = _tar_of(hpc)
    inode = [p.stat().st_ino for p in sorted(tar.glob("*.tar"))]
    assert len(inode) == 3  # 5,000 files: the folders' part and two file parts
    # Unchanged: the same tar (same inode) is reused; a touched file packs again.
    proc = hpc.run("run", "--dry-run", "--stage", "dataset", "--", "true")
    assert proc.returncode == 0 and str(tar) in proc.stdout, proc.stderr
    proc = hpc.run("run", "--stage", "dataset", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert _tar_of(hpc) == [tar] and [p.stat().st_ino for p in sorted(tar.glob("*.tar"))] == inode
    assert "packed" not in proc.stderr
    touched = hpc.cwd / "dataset" / "d007" / "sub1" / "f00700.bin"
    os.utime(touched, (time.time() + 5, time.time() + 5))
    proc = hpc.run("run", "--stage", "dataset", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert "packed" in proc.stderr and len(_tar_of(hpc)) == 2
    testbed.wait_idle(timeout=120)


SCRIPT = (
    'mkdir -p "$HPCLAUNCH_LOCAL/out" && echo "from $SLURMD_NODENAME rank $RANK" > '
    '"$HPCLAUNCH_LOCAL/out/r$RANK.txt"; ls "$HPCLAUNCH_DATA" > /dev/null; '
)


def _job(
    hpc: Hpc, name: str, tail: str, *extra: str, wait: bool = True
) -> subprocess.CompletedProcess[str]:
    data = hpc.folder(f"data-{name}")
    (data / "x.txt").write_text("x")
    _chown_tree(hpc, data)
    args = ["run", "-N", "2", "--stage", str(data), "--stage-out", f"out:results-{name}", *extra]
    return hpc.run(
        *args, *(["--wait"] if wait else []), "--", "bash", "-c", SCRIPT + tail, timeout=300
    )


def _results(hpc: Hpc, name: str) -> dict[str, list[str]]:
    root = hpc.cwd / f"results-{name}"
    return (
        {n.name: sorted(p.name for p in n.iterdir()) for n in sorted(root.iterdir())}
        if root.exists()
        else {}
    )


def test_cleanup_and_stage_out_after_success_failure_and_time_limit(hpc: Hpc) -> None:
    proc = _job(hpc, "ok", "exit 0")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = _job(hpc, "fail", "sleep 1; exit 3")  # both ranks write first
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = _job(hpc, "timeout", "sleep 300", "-p", "short", "-t", "1")
    assert proc.returncode == 124, proc.stdout[-2000:] + proc.stderr[-2000:]
    for name in ("ok", "fail", "timeout"):
        results = _results(hpc, name)
        if testbed.layout() == "netns":
            assert results == {"node1": ["r0.txt"], "node2": ["r1.txt"]}, (name, results)
    assert _locals_on_nodes(hpc) == {"node1": [], "node2": []}


@pytest.mark.serial  # waits for an idle cluster; reads the nodes' /tmp
def test_cleanup_after_scancel_and_leftovers_of_dead_jobs(hpc: Hpc) -> None:
    # Leftovers: this user's folder for a job id that no longer runs (removed by the next
    # staging step on that node), someone else's folder (never touched).
    _on_nodes("mkdir -p /tmp/hpclaunch-99999.ab12/data && touch /tmp/hpclaunch-99999.ab12/data/f")
    _on_nodes("mkdir -p /tmp/hpclaunch-99998.cd34 /tmp/hpclaunch-99997.ef56", as_root=True)
    proc = _job(hpc, "cancel", "sleep 300", "--json", wait=False)
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads(proc.stdout)["job_id"]
    run_dir = Path(json.loads(proc.stdout)["run_dir"])
    deadline = time.monotonic() + 120
    while len(list((run_dir / "logs").glob("rank-*.out"))) < 2:  # the ranks have started
        assert time.monotonic() < deadline, "the job never started its ranks"
        time.sleep(0.5)
    time.sleep(1)
    assert hpc.run("cancel", job_id).returncode == 0
    testbed.wait_idle(timeout=120)
    if testbed.layout() == "netns":
        assert _results(hpc, "cancel") == {"node1": ["r0.txt"], "node2": ["r1.txt"]}
    remaining = _locals_on_nodes()
    for node, names in remaining.items():
        # The user's dead job's folder is gone; root's folders (another user) stay.
        assert names == ["hpclaunch-99997.ef56", "hpclaunch-99998.cd34"], (node, names)
    _on_nodes("rm -rf /tmp/hpclaunch-99998.cd34 /tmp/hpclaunch-99997.ef56", as_root=True)


def test_a_dataset_larger_than_the_node_local_space_is_refused(hpc: Hpc) -> None:
    data = hpc.folder("big")
    (data / "blob").write_bytes(os.urandom(3 * 2**20))
    (hpc.cwd / "hpclaunch.toml").write_text('[clusters.slurm.node]\nlocal_disk = "2M"\n')
    proc = hpc.run("run", "--stage", str(data), "--", "true")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("hpclaunch: error: --stage: 3M"), line
    assert "2M of node-local space" in line
    assert hpc.run_dirs() == [] and hpc.runs() == []
    assert not (hpc.cwd / "runs" / ".stage-cache").exists()  # refused before packing


def test_local_cluster_stages_too(hpc: Hpc) -> None:
    sums = _dataset(hpc.cwd / "dataset", files=200)
    _chown_tree(hpc, hpc.cwd / "dataset")
    out = hpc.folder("out")
    program = _sums_program(hpc)
    proc = hpc.run(
        "run", "--cluster", "local", "--tasks-per-node", "2", "--stage", "dataset",
        "--", "python3", str(program), str(out),
        env={"SLURMD_NODENAME": "local"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    reports: list[dict[str, Any]] = [json.loads(p.read_text()) for p in out.glob("sums-*.json")]
    assert len(reports) == 2 and all(r["sums"] == sums for r in reports)
    assert not os.path.exists(reports[0]["local"])  # removed when the local job ended
    shutil.rmtree(hpc.cwd / "dataset")
