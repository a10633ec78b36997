"""Record what the testbed's real Slurm (22.05) answers to the commands hpclaunch runs, in
the formats hpclaunch asks for, into tests/data/slurm-22.05/ (one JSON file per answer:
argv, returncode, stdout, stderr). tests/slurm_replay.py replays them in-process for the
unit tests of logic that only parses or decides (see the README there).

    sudo SLURM_CONF=/var/tmp/hpclaunch-testbed/slurm.conf .venv/bin/python tests/record_slurm.py

Needs root and the running testbed (``testbed/up.sh``): it submits a few small jobs as the
testbed's user from a fresh folder under the shared work folder, records, and cancels
them. Re-recording rewrites the files; job ids and times change, the formats must not.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import testbed
from hpclaunch.slurm.arraytasks import SACCT_FIELDS, SQUEUE_ARGV
from hpclaunch.sweeps import arrays

OUT = Path(__file__).resolve().parent / "data" / "slurm-22.05"


def _record(name: str, argv: list[str], cwd: Path) -> dict[str, object]:
    done = testbed.run_as_user(argv, cwd=cwd, timeout=60)
    answer = {
        "argv": argv,
        "returncode": done.returncode,
        "stdout": done.stdout,
        "stderr": done.stderr,
    }
    (OUT / f"{name}.json").write_text(json.dumps(answer, indent=1) + "\n")
    return answer


def _sbatch(folder: Path, *args: str) -> str:
    argv = ["sbatch", "--parsable", "-o", "/dev/null", *args]
    done = testbed.run_as_user(argv, cwd=folder)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def _wait(what: str, check: object, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def _state(job: str) -> str:
    done = testbed.run_as_user(["squeue", "-h", "-j", job, "-o", "%T"], cwd=Path("/"))
    return done.stdout.strip()


def record(folder: Path) -> None:
    user = testbed.USER
    # A plain job that runs, a job that completes with exit 3, and
    # an array whose tasks queue behind its throttle (%1), one of them held.
    running = _sbatch(folder, "--wrap", "sleep 120")
    failing = _sbatch(folder, "--wrap", "exit 3")
    array = _sbatch(folder, "--array=0-3%1", "--wrap", "sleep 30")
    _wait("the running job to start", lambda: _state(running) == "RUNNING")
    _wait("the failing job to end", lambda: _state(failing) == "")
    testbed.run_as_user(["scontrol", "hold", f"{array}_3"], cwd=folder)
    _wait("the array's first task to start", lambda: "RUNNING" in _state(array))

    _record("sbatch_parsable", ["sbatch", "--parsable", "-o", "/dev/null", "--hold",
                                "--wrap", "true"], folder)  # fmt: skip
    held = json.loads((OUT / "sbatch_parsable.json").read_text())["stdout"].strip()
    _record("squeue_tasks", [*SQUEUE_ARGV, "-j", ",".join([running, array, held])], folder)
    _record("squeue_tasks_forgotten", [*SQUEUE_ARGV, "-j", "999999"], folder)
    _record("squeue_ended", [*SQUEUE_ARGV, "-j", failing], folder)  # within MinJobAge
    nodes = _record("squeue_nodes_of_job", ["squeue", "-h", "-j", running, "-o", "%A|%N"], folder)
    nodelist = str(nodes["stdout"]).strip().partition("|")[2]
    _record("scontrol_hostnames", ["scontrol", "show", "hostnames", nodelist], folder)
    _record("scontrol_hostnames_range", ["scontrol", "show", "hostnames", "node[1-2]"], folder)
    _record("scontrol_job_ended", ["scontrol", "-o", "show", "job", failing], folder)
    _record("scontrol_job_running", ["scontrol", "-o", "show", "job", running], folder)
    for mode, name in (("-X", "sacct_database"), ("-c", "sacct_jobcomp")):
        argv = ["sacct", mode, "-n", "-P", "-j", failing, "-o", SACCT_FIELDS]
        _record(name, argv, folder)
    _record("sinfo_nodes", ["sinfo", "-h", "-N", "-o", "%N|%T|%G"], folder)
    _record("sinfo_partitions", ["sinfo", "-h", "-o", "%P|%l|%D|%c|%G|%m|%s|%d|%L"], folder)
    _record("scontrol_show_config", ["scontrol", "show", "config"], folder)
    _record("sdiag", ["sdiag"], folder)
    _record("squeue_count", [*arrays.SQUEUE_COUNT_ARGV, "-u", user], folder)
    _record("squeue_scripts", ["squeue", "-h", "-u", user, "-o", "%o"], folder)
    _record("sacctmgr_assoc", arrays.sacctmgr_argv(user), folder)
    testbed.run_as_user(["scancel", running, array, held], cwd=folder)


def main() -> None:
    if testbed.skip_reason():
        sys.exit(f"record_slurm: {testbed.skip_reason()}")
    OUT.mkdir(parents=True, exist_ok=True)
    folder = testbed.work_dir() / f"record-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    owner = pwd.getpwnam(testbed.USER)
    os.chown(folder, owner.pw_uid, owner.pw_gid)
    try:
        record(folder)
    finally:
        left = [line.split()[0] for line in testbed.jobs_from(folder)]
        if left:
            testbed.run_as_user(["scancel", *left], cwd=testbed.work_dir())
        shutil.rmtree(folder, ignore_errors=True)
    version = subprocess.run(["sinfo", "-V"], capture_output=True, text=True, check=False)
    print(f"recorded {len(list(OUT.glob('*.json')))} answers of {version.stdout.strip()}")


if __name__ == "__main__":
    main()
