"""Issue 24 item 1 on the testbed's two nodes: another user, hpcother, plants at the
node-local paths hpclaunch used to predict (/tmp/$USER-hpclaunch-$SLURM_JOB_ID, LUMI's
/tmp/$USER-miopen-cache-$SLURM_JOB_ID, /tmp/$USER-nccl-%h-%p.txt) before the victim's
(hpcuser's) job; the job must run with its own data, nothing may land through a planted
symlink, and the victim's 0600 file may appear in no log.

The victim's job id is not known in advance (the testbed is shared, and reconfiguring
the controller is not allowed), so hpcother plants for the next PLANTED ids after one it
gets from Slurm itself (a held job it cancels), as a neighbour on a real cluster would;
the NCCL file's name holds a pid, so hpcother plants for the next pids of the nodes.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import testbed
from conftest import Hpc

pytestmark = pytest.mark.testbed

PLANTED = 40  # job ids planted for, after the one hpcother got (few: the testbed is shared)
PIDS = 40000  # pids planted for (the NCCL debug file's %p)
LOOT = "/tmp/hpcother-loot"  # hpcother's world-writable folder on each node

# Run as hpcother on a node: plants for job ids FIRST..LAST-1 and pids PID..PID+PIDS-1.
PLANT = r"""
import os, sys
first, last, kind, target, secret, pid, pids, host = sys.argv[1:]
os.mkdir(LOOT)
os.chmod(LOOT, 0o777)
for job in range(int(first), int(last)):
    top = "/tmp/hpcuser-hpclaunch-%d" % job
    os.mkdir(top)
    if kind == "link":  # the staged data would land in another folder of the victim's
        os.symlink(target, top + "/data")
    else:  # the victim's program would read hpcother's data
        os.makedirs(top + "/data/DATA")
        for name in ("f.txt", "extra.txt"):
            with open(top + "/data/DATA/" + name, "w") as handle:
                handle.write("planted")
        for path in (top + "/data", top + "/data/DATA"):
            os.chmod(path, 0o777)
    os.symlink(LOOT, top + "/out")  # the stage-out source: results would go to hpcother
    os.chmod(top, 0o777)
    miopen = "/tmp/hpcuser-miopen-cache-%d" % job
    os.mkdir(miopen)
    with open(miopen + "/poison.db", "w") as handle:
        handle.write("planted")
    os.chmod(miopen, 0o777)
for number in range(int(pid), int(pid) + int(pids)):
    try:
        os.symlink(secret, "/tmp/hpcuser-nccl-%s-%d.txt" % (host, number))
    except FileExistsError:
        pass
""".replace("LOOT", repr(LOOT))

# The victim's program: its view of the data, where its results and caches go.
VICTIM = r"""
import json, os, sys
rank = os.environ["RANK"]
local, data = os.environ["HPCLAUNCH_LOCAL"], os.environ["HPCLAUNCH_DATA"]
os.makedirs(os.path.join(local, "out"), exist_ok=True)
with open(os.path.join(local, "out", "r%s.txt" % rank), "w") as handle:
    handle.write("result")
db = os.environ["MIOPEN_USER_DB_PATH"]
with open(os.path.join(db, "db-%s.txt" % rank), "w") as handle:
    handle.write("db")
with open(os.path.join(data, "f.txt")) as handle:
    text = handle.read()
report = {
    "node": os.environ.get("SLURMD_NODENAME", ""), "local": local, "db": db,
    "files": sorted(os.listdir(data)), "text": text, "db_files": sorted(os.listdir(db)),
    "nccl": os.environ.get("NCCL_DEBUG_FILE", ""),
}
with open(os.path.join(sys.argv[1], "report-%s.json" % rank), "w") as handle:
    json.dump(report, handle)
"""


def _next_job_id(other: Hpc) -> int:
    """A job id Slurm just gave hpcother (a held job, cancelled at once)."""
    done = other.cmd(["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"])
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    other.cmd(["scancel", job])
    return int(job)


def _lumi_caches(hpc: Hpc) -> None:
    """The victim's own profile layer over `slurm`: LUMI's MIOpen cache settings, as the
    built-in lumi profile has them (whatever they are in the code under test)."""
    import hpclaunch
    from hpclaunch.config.tomlfiles import read_toml

    lumi = Path(hpclaunch.__file__).parent / "config" / "clusters" / "lumi.toml"
    values = read_toml(lumi, "lumi")
    env = {k: v for k, v in values["env"].items() if k.startswith("MIOPEN_")}
    lines = [f"cache_dirs = {json.dumps(values['cache_dirs'])}", "[env]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in env.items()]
    folder = Path(hpc.env["XDG_CONFIG_HOME"]) / "hpclaunch" / "clusters"
    folder.mkdir(parents=True)
    (folder / "slurm.toml").write_text("\n".join(lines) + "\n")
    info = hpc.cwd.stat()
    for path in (folder.parent, folder, folder / "slurm.toml"):
        os.chown(path, info.st_uid, info.st_gid)


def _clean_nodes() -> None:
    script = (
        "rm -rf /tmp/hpcuser-hpclaunch-* /tmp/hpcuser-miopen-cache-* " + LOOT + "; "
        "find /tmp -maxdepth 1 -name 'hpcuser-nccl-*' -user hpcother -delete"
    )
    for name in testbed.NODES:
        testbed.on_node(name, ["bash", "-c", script], user="root")


def _node_listing(name: str, command: str) -> str:
    done = testbed.on_node(name, ["bash", "-c", command], user="root")
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.serial  # turns fs.protected_symlinks off; waits for an idle cluster
def test_planted_node_local_paths_are_neither_used_nor_in_the_way(hpc: Hpc, other: Hpc) -> None:
    if testbed.layout() != "netns":
        pytest.skip("needs the nodes' private /tmp (netns layout)")
    secret_text = f"TOPSECRET-{uuid.uuid4().hex}"
    secret = hpc.cwd / "secret.txt"
    secret.write_text(secret_text + "\n")
    info = hpc.cwd.stat()
    os.chown(secret, info.st_uid, info.st_gid)
    secret.chmod(0o600)
    target = hpc.folder("target")  # another folder of the victim's
    data = hpc.folder("mydata")
    (data / "f.txt").write_text("victim")
    os.chown(data / "f.txt", info.st_uid, info.st_gid)
    reports, results = hpc.folder("reports"), hpc.cwd / "results"
    program = hpc.cwd / "victim.py"
    program.write_text(VICTIM)
    _lumi_caches(hpc)
    first = _next_job_id(other) + 1
    pid = int(Path("/proc/sys/kernel/ns_last_pid").read_text()) + 1
    _clean_nodes()
    try:
        with testbed.protected_symlinks_off():
            for name, kind in zip(testbed.NODES, ("link", "data")):
                argv = ["python3", "-c", PLANT, str(first),
                        str(first + PLANTED), kind, str(target), str(secret), str(pid),
                        str(PIDS), name]  # fmt: skip
                done = testbed.on_node(name, argv)
                assert done.returncode == 0, done.stderr
            proc = hpc.run(
                "run", "-N", "2", "--wait", "--nccl-debug",
                "--stage", f"{data}:DATA", "--stage-out", f"out:{results}",
                "--", "python3", str(program), str(reports), timeout=300,
            )  # fmt: skip
            testbed.wait_idle(timeout=120)
            listing = f"find {LOOT} /tmp/hpcuser-miopen-cache-* -mindepth 1 -printf '%f\\n'"
            after = {n: _node_listing(n, listing) for n in testbed.NODES}
    finally:
        _clean_nodes()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run_dir] = hpc.run_dirs()
    job = json.loads((run_dir / "run.json").read_text())
    assert first <= int(job["job_id"]) < first + PLANTED, (first, job)  # it was planted for
    assert sorted(p.name for p in target.iterdir()) == []  # nothing through `data`
    for name, listing in after.items():  # nothing through `out`, no MIOpen file planted in
        assert listing.split() == ["poison.db"] * PLANTED, (name, listing[:500])
    for path in [*run_dir.rglob("*")]:
        if path.is_file():
            assert secret_text not in path.read_text(errors="replace"), path
    assert secret_text not in proc.stdout + proc.stderr
    found = [json.loads(p.read_text()) for p in sorted(reports.glob("report-*.json"))]
    assert [r["node"] for r in found] == ["node1", "node2"], found
    for report in found:
        # Its own data, nothing planted beside it; its caches in its own private folder.
        assert (report["files"], report["text"]) == (["f.txt"], "victim"), report
        assert not report["local"].startswith("/tmp/hpcuser-"), report
        assert report["db"].startswith(report["local"] + "/"), report
        assert report["nccl"].startswith(report["local"] + "/"), report
        assert len(report["db_files"]) == 1, report
    assert sorted(p.name for p in results.iterdir()) == ["node1", "node2"]


# --- cleanup: never a running local run's folder (squeue answers here, as on a login
# node: before, a local run's folder looked like a Slurm job that no longer runs).

LOCAL = {"HPCLAUNCH_CLUSTER": "local"}
# Waits, then checks that its staged data is still all there.
CHECKER = (
    'sleep "$1"; n=$(find "$HPCLAUNCH_DATA" -type f | wc -l); echo "files $n"; [ "$n" = "$2" ]'
)


def _data(hpc: Hpc, files: int = 1, size: int = 4) -> Path:
    data = hpc.folder("mydata")
    block = os.urandom(size)
    info = hpc.cwd.stat()
    for n in range(files):
        (data / f"f{n:04d}.bin").write_bytes(block)
        os.chown(data / f"f{n:04d}.bin", info.st_uid, info.st_gid)
    return data


def _start(hpc: Hpc, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["runuser", "-u", hpc.user, "--", "hpclaunch", *args], cwd=hpc.cwd,
        env={**hpc.env, **LOCAL}, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _local_folders() -> set[Path]:
    """The test user's local runs' node-local folders in /tmp (either naming)."""
    uid = pwd.getpwnam(testbed.USER).pw_uid
    found = {*Path("/tmp").glob("hpclaunch-local-*"), *Path("/tmp").glob("hpcuser-hpclaunch-*")}
    return {p for p in found if p.lstat().st_uid == uid}


def _wait_for(check: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.serial  # waits for a new local-run folder in /tmp, anyone's
def test_two_local_runs_at_once_keep_their_data(hpc: Hpc) -> None:
    data = _data(hpc)
    before = _local_folders()
    first = _start(hpc, "run", "--stage", str(data), "--", "bash", "-c", CHECKER, "-", "8", "1")
    _wait_for(lambda: bool(_local_folders() - before))
    time.sleep(1)  # its ranks run
    second = hpc.run("run", "--stage", str(data), "--", "true", env=LOCAL)
    assert second.returncode == 0, second.stderr
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, out[-2000:] + err[-2000:]
    assert "files 1" in out, out


def test_a_local_sweep_of_two_at_once_keeps_each_points_data(hpc: Hpc) -> None:
    data = _data(hpc)
    proc = hpc.run(
        "sweep", "--grid", "k=6,1", "--max-parallel", "2", "--stage", str(data), "--wait",
        "--", "bash", "-c", CHECKER, "-", "{k}", "1", env=LOCAL, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.serial  # waits for a new local-run folder in /tmp, anyone's
def test_clean_during_an_unpack_leaves_the_running_run_alone(hpc: Hpc) -> None:
    data = _data(hpc, files=600, size=512 * 1024)  # 300 MiB: unpacking takes a while
    first = hpc.run("run", "--stage", str(data), "--", "true", env=LOCAL, timeout=300)
    assert first.returncode == 0, first.stderr  # packed: the next run goes straight to unpack
    before = _local_folders()
    run = _start(hpc, "run", "--stage", str(data), "--", "bash", "-c", CHECKER, "-", "1", "600")
    _wait_for(lambda: bool(_local_folders() - before))
    cleaned = hpc.run("clean", "--json", env=LOCAL)
    assert cleaned.returncode == 0, cleaned.stderr
    out, err = run.communicate(timeout=300)
    assert json.loads(cleaned.stdout)["removed"] == [], cleaned.stdout
    assert run.returncode == 0 and "files 600" in out, out[-2000:] + err[-2000:]


@pytest.mark.serial  # reads everything in the nodes' /tmp
def test_clean_on_a_node_removes_only_the_users_folders_of_ended_jobs(hpc: Hpc, other: Hpc) -> None:
    """`hpclaunch clean` on a compute node, while a job of the user runs there: the
    user's folder of an ended job goes; the running job's, another user's (named alike)
    and a symlink of the user's named alike stay, and nothing behind the link is touched."""
    if testbed.layout() != "netns":
        pytest.skip("needs the nodes' private /tmp (netns layout)")
    keep = hpc.folder("keep")
    (keep / "f.txt").write_text("keep")
    data = _data(hpc)
    started = hpc.run("run", "-N", "2", "--json", "--stage", str(data), "--", "sleep", "60")
    assert started.returncode == 0, started.stderr
    job = json.loads(started.stdout)
    logs = Path(job["run_dir"]) / "logs"
    _wait_for(lambda: len(list(logs.glob("rank-*.out"))) == 2, timeout=240)
    user_script = f"mkdir /tmp/hpclaunch-1.dead01 && ln -s {keep} /tmp/hpclaunch-3.link01"
    try:
        for argv, user in (
            (["bash", "-c", user_script], testbed.USER),
            (["mkdir", "-m", "777", "/tmp/hpclaunch-2.other1"], testbed.OTHER_USER),
        ):
            done = testbed.on_node("node1", argv, user=user)
            assert done.returncode == 0, done.stderr
        clean = [
            "env", f"PATH={hpc.env['PATH']}", f"SLURM_CONF={hpc.env['SLURM_CONF']}",
            f"HOME={hpc.env['HOME']}", "USER=hpcuser", "hpclaunch", "clean", "--json",
        ]  # fmt: skip
        done = testbed.on_node("node1", clean, user=testbed.USER)
        assert done.returncode == 0, done.stderr
        listing = testbed.node_tmp("node1")
    finally:
        hpc.run("cancel", job["job_id"])
        testbed.on_node(
            "node1",
            ["rm", "-rf", "/tmp/hpclaunch-1.dead01", "/tmp/hpclaunch-2.other1",
             "/tmp/hpclaunch-3.link01"],
            user="root",
        )  # fmt: skip
    assert json.loads(done.stdout)["removed"] == ["/tmp/hpclaunch-1.dead01"], done.stdout
    assert "hpclaunch-2.other1" in listing and "hpclaunch-3.link01" in listing, listing
    assert [n for n in listing if n.startswith(f"hpclaunch-{job['job_id']}.")], listing
    assert (keep / "f.txt").read_text() == "keep"
