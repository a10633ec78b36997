"""Nothing lost on the file systems clusters have (issue 25, items 1, 2, 3, 5), on the
testbed: a run, a sweep and an Optuna sweep with flock failing in every hpclaunch
process; a full disk during a run; two reruns at once, each in its own copy of the
snapshot; a local run whose launcher pid now belongs to another user."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import testbed
from conftest import PROGRAMS, Hpc

pytestmark = pytest.mark.testbed

POINT = str(PROGRAMS / "sweep_point.py")

# Imported by every Python of the user's (PYTHONPATH, passed through the environment to
# the jobs): flock fails as on Lustre's default mount, and each try is logged.
NO_FLOCK = """\
import errno, fcntl, os

def _no_flock(fd, operation):
    log = os.environ.get("NO_FLOCK_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write("%d\\n" % os.getpid())
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

fcntl.flock = _no_flock
"""


def _no_flock_env(hpc: Hpc) -> tuple[dict[str, str], Path]:
    inject = hpc.folder("inject")
    (inject / "sitecustomize.py").write_text(NO_FLOCK)
    log = hpc.cwd / "flock-tries.log"
    return {"PYTHONPATH": str(inject), "NO_FLOCK_LOG": str(log)}, log


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    """The command's one JSON object (indented or on its first line)."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return json.loads(proc.stdout.splitlines()[0])


def _rows(hpc: Hpc) -> list[dict[str, Any]]:
    """`hpclaunch runs --json`: one object per run, newest first."""
    proc = hpc.run("runs", "--json")
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_run_sweep_and_optuna_without_flock(hpc: Hpc) -> None:
    env, log = _no_flock_env(hpc)
    hpc.env.update(env)
    done = hpc.run("run", "--wait", "--", "python3", "-c", "print('ran')")
    assert done.returncode == 0, done.stderr
    assert "ran" in done.stdout and "Traceback" not in done.stderr
    assert log.exists() and log.read_text().strip()  # flock was tried, and failed
    status = _json(hpc.run("status", "last", "--json"))
    assert status["state"] == "COMPLETED" and status["exit_code"] == 0
    run_dir = Path(status["run_dir"])
    assert not list(run_dir.glob(".hpclaunch.lock*"))  # no lock file left

    out = hpc.folder("out")
    grid = _json(
        hpc.run(
            "sweep",
            "--json",
            "--grid",
            "lr=0.1,0.2",
            "--wait",
            "--",
            "python3",
            POINT,
            str(out),
            "--lr={lr}",
            timeout=240,
        )
    )
    swept = _json(hpc.run("sweep", "status", grid["sweep_id"], "--json"))
    assert [p["state"] for p in swept["points"]] == ["COMPLETED"] * 2

    pytest.importorskip("optuna")
    space = hpc.cwd / "space.toml"
    space.write_text('x = {type = "float", low = -5.0, high = 5.0}\n')
    tried_before = len(log.read_text().split())
    optuna = _json(
        hpc.run(
            "sweep",
            "--json",
            "--optuna",
            str(space),
            "--trials",
            "3",
            "--metric",
            "loss",
            "--max-parallel",
            "2",
            "--wait",
            "--",
            "python3",
            POINT,
            str(out),
            "--quadratic",
            "--x={x}",
            timeout=240,
        )
    )
    points = _json(hpc.run("sweep", "status", optuna["sweep_id"], "--json"))["points"]
    assert [p["state"] for p in points] == ["COMPLETED"] * 3
    assert all(p["result"]["loss"] == pytest.approx((p["params"]["x"] - 2) ** 2) for p in points)
    # The points' own ask/tell on the batch hosts tried flock too (and went on).
    tries = [int(pid) for pid in log.read_text().split()[tried_before:]]
    assert len(set(tries)) >= 3, tries


# A full disk: a small tmpfs as the run root and the index's folder (local runs: the
# nodes' mount namespaces do not see a tmpfs mounted here).


WAIT_FOR_GO = (
    "import os, sys, time\n"
    "print('rank started', flush=True)\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
)


def test_a_full_disk_during_a_run_loses_no_run(hpc: Hpc) -> None:
    with testbed.small_tmpfs("16m", owner=hpc.user) as mount:
        hpc.env.update({"XDG_DATA_HOME": str(mount / "xdg"), "HPCLAUNCH_CLUSTER": "local"})
        go = hpc.cwd / "go"
        root = ("--run-root", str(mount / "runs"))
        first = subprocess.Popen(
            ["runuser", "-u", hpc.user, "--", "hpclaunch", "run", *root, "--",
             "python3", "-c", WAIT_FOR_GO, str(go)],
            cwd=hpc.cwd, env=hpc.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        logs: list[Path] = []
        while time.monotonic() < deadline and not any(
            "rank started" in p.read_text(errors="replace") for p in logs
        ):
            time.sleep(0.1)
            logs = list((mount / "runs").glob("*/*/logs/*"))
        filler = testbed.fill(mount)  # full while the run goes on, and at its end
        go.touch()
        _out, err = first.communicate(timeout=60)
        assert first.returncode == 0, err  # the job's own code, not a crash
        assert "Traceback" not in err and "could not be updated" in err, err
        run_dir = next((mount / "runs").glob("*/*"))
        assert not list(run_dir.glob("*.tmp")) and not list(run_dir.glob(".*.tmp"))
        assert json.loads((run_dir / "run.json").read_text())["state"] == "RUNNING"

        # The disk still full: the next run is refused before it starts, leaving nothing.
        refused = hpc.run("run", *root, "--", "true")
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert len(list((mount / "runs").glob("*/*"))) == 1

        filler.unlink()
        second = hpc.run("run", *root, "--", "python3", "-c", "print('second')")
        assert second.returncode == 0, second.stderr
        rows = _rows(hpc)
        assert [(r["state"], r["exit_code"]) for r in rows] == [("COMPLETED", 0)] * 2, rows
        stored = json.loads((run_dir / "run.json").read_text())
        assert stored["state"] == "COMPLETED"  # brought up to date once space was back
        hpc.env.pop("HPCLAUNCH_CLUSTER")


def test_two_reruns_at_once_each_in_their_own_snapshot_copy(hpc: Hpc) -> None:
    project = hpc.folder("proj")
    (project / "prog.py").write_text(
        "import os, sys, time\n"
        "open('out.txt', 'w').write(sys.argv[1] + ' ' + os.environ['SLURM_JOB_ID'])\n"
        "time.sleep(2)\n"
        "print(open('out.txt').read(), flush=True)\n"
    )
    (project / ".gitignore").write_text("runs/\nout.txt\n")
    for path in (project / "prog.py", project / ".gitignore"):
        os.chown(path, pwd.getpwnam(hpc.user).pw_uid, pwd.getpwnam(hpc.user).pw_gid)
    here = Hpc(cwd=project, env=hpc.env, user=hpc.user)
    for argv in (["init", "-q"], ["add", "prog.py", ".gitignore"],
                 ["-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "v1"]):  # fmt: skip
        assert here.cmd(["git", "-C", str(project), *argv]).returncode == 0
    first = here.run("run", "--wait", "--json", "--", "python3", "prog.py", "first")
    assert first.returncode == 0, first.stderr
    record = _json(here.run("status", "last", "--json"))
    earlier = Path(record["run_dir"]) / "code" / "out.txt"
    assert earlier.read_text().startswith("first ")
    before = earlier.read_text()

    reruns = [
        subprocess.Popen(
            ["runuser", "-u", hpc.user, "--", "hpclaunch", "rerun", record["run_id"], "--wait"],
            cwd=project,
            env=hpc.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    said = [proc.communicate(timeout=180) for proc in reruns]
    assert [proc.returncode for proc in reruns] == [0, 0], said
    assert earlier.read_text() == before  # the earlier run's file is unchanged
    copies = sorted(p for p in (project / "runs").glob("*/*/code/out.txt") if p != earlier)
    assert len(copies) == 2
    jobs = {c.read_text().split()[1] for c in copies}
    assert len(jobs) == 2  # each rerun wrote its own file, in its own folder
    for copy in copies:
        assert os.stat(copy).st_ino != os.stat(earlier).st_ino
        assert not (copy.parent / "prog.py").samefile(earlier.parent / "prog.py")


def test_a_local_run_whose_launcher_pid_is_another_users_is_cancelled(hpc: Hpc, other: Hpc) -> None:
    hpc.env["HPCLAUNCH_CLUSTER"] = "local"
    done = hpc.run("run", "--", "true")
    assert done.returncode == 0, done.stderr
    run_dir = next((hpc.cwd / "runs").glob("*/*"))
    sleeper = subprocess.Popen(["runuser", "-u", other.user, "--", "sleep", "120"])
    try:
        pid = sleeper.pid
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # runuser's child: the sleep itself
            kids = Path(f"/proc/{sleeper.pid}/task/{sleeper.pid}/children").read_text().split()
            if kids:
                pid = int(kids[0])
                break
            time.sleep(0.05)
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        started = float(fields[19]) / os.sysconf("SC_CLK_TCK")
        # The record as a launcher that still ran would leave it, its pid now hpcother's
        # sleep (even with that process's start time: the owner alone tells).
        data = json.loads((run_dir / "run.json").read_text())
        data.update(state="RUNNING", exit_code=None, launcher_pid=pid, launcher_started=started)
        (run_dir / "run.json").write_text(json.dumps(data))
        with contextlib.suppress(FileNotFoundError):
            (run_dir / "events.jsonl").unlink()  # no rank reported its end
        status = _json(hpc.run("status", str(data["run_id"]), "--json"))
        assert status["state"] == "CANCELLED", status
        assert "another user" in status["reason"], status
    finally:
        sleeper.kill()
        sleeper.wait()
        hpc.env.pop("HPCLAUNCH_CLUSTER")
