"""--after and --chain on the real testbed: Slurm dependencies (afterok, afterany,
--kill-on-invalid-dep) resolved from hpclaunch's records, a chain on one checkpoint
folder that stops once the program says it is done."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import testbed
from conftest import Hpc, load_json_lines

pytestmark = pytest.mark.testbed

CHAIN_PROGRAM = """
import os, time
ckpt = os.environ["HPCLAUNCH_CHECKPOINT_DIR"]
attempt = int(os.environ["HPCLAUNCH_ATTEMPT"])
with open(os.path.join(ckpt, "members.log"), "a") as log:
    log.write("%d %s %.3f\\n" % (attempt, os.environ.get("HPCLAUNCH_RESUME", "0"), time.time()))
time.sleep(1)
if attempt == int(os.environ.get("DONE_AT", "99")):
    open(os.environ["HPCLAUNCH_DONE_FILE"], "w").close()
"""


def _record(hpc: Hpc, run: str) -> dict[str, Any]:
    proc = hpc.run("status", run, "--json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _start(hpc: Hpc, *args: str) -> dict[str, Any]:
    proc = hpc.run("run", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _until_ended(hpc: Hpc, run: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    pause = 0.5
    while True:
        record = _record(hpc, run)
        if record["state"] not in ("PENDING", "RUNNING", "CREATED", "REQUEUED", "CONFIGURING"):
            return record
        assert time.monotonic() < deadline, record
        time.sleep(pause)
        pause = min(pause * 1.5, 3)


def test_after_ok_waits_for_completion_and_a_failure_never_leaves_it_pending(hpc: Hpc) -> None:
    # Both end once `release` exists, after every dependent is queued: a fixed sleep lost
    # the race on a loaded testbed (the bad run had ended before `--after` was given).
    release = hpc.cwd / "release"
    wait = f"until [ -e {release} ]; do sleep 0.2; done"
    good = _start(hpc, "--", "bash", "-c", wait)
    bad = _start(hpc, "--", "bash", "-c", f"{wait}; exit 3")
    after_good = _start(hpc, "--after", f"{good['run_id']}:ok", "--", "true")
    after_bad = _start(hpc, "--after", f"{bad['job_id']}:ok", "--", "true")
    after_any = _start(hpc, "--after", f"{bad['run_id']}:any", "--", "true")
    release.touch()
    shown = hpc.run("show", after_good["run_id"], "--json").stdout
    assert f"--dependency=afterok:{good['job_id']}" in shown

    ran = _until_ended(hpc, after_good["run_id"])
    assert ran["state"] == "COMPLETED"
    first = _until_ended(hpc, good["run_id"])
    first_end = max(e["time"] for e in load_json_lines(Path(first["run_dir"]) / "events.jsonl"))
    second_start = min(e["time"] for e in load_json_lines(Path(ran["run_dir"]) / "events.jsonl"))
    assert second_start >= first_end

    never = _until_ended(hpc, after_bad["run_id"])
    assert never["state"] == "CANCELLED", never
    assert never["reason"] == f"never started: --after {bad['run_id']}:ok, and it ended FAILED"
    assert _until_ended(hpc, after_any["run_id"])["state"] == "COMPLETED"
    assert testbed.jobs_from(hpc.cwd) == []  # this test's jobs: others run side by side

    # Already ended: judged from the records, before anything is submitted.
    refused = hpc.run("run", "--after", f"{bad['run_id']}", "--", "true")
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        f"hpclaunch: error: --after: '{bad['run_id']}': {bad['run_id']} ended FAILED "
        "(so this run could never start)."
    ), refused.stderr
    met = _start(hpc, "--after", f"{good['run_id']}:ok", "--", "true")
    assert "--dependency" not in hpc.run("show", met["run_id"]).stdout


def test_chain_runs_in_order_on_one_folder_and_stops_when_done(hpc: Hpc) -> None:
    (hpc.cwd / "member.py").write_text(CHAIN_PROGRAM)
    whole = subprocess.Popen(
        ["runuser", "-u", testbed.USER, "--", "hpclaunch", "run", "--chain", "3", "--wait",
         "--", "python3", "member.py"],
        cwd=hpc.cwd, env=hpc.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    early = _start(hpc, "--chain", "3", "--env", "DONE_AT=0", "--", "python3", "member.py")
    out, err = whole.communicate(timeout=300)
    assert whole.returncode == 0, out + err
    run_id = next(e["run_id"] for e in hpc.runs() if e["run_id"] != early["run_id"])
    record = _record(hpc, run_id)
    assert record["state"] == "COMPLETED" and len(record["job_ids"]) == 3
    members = (Path(record["checkpoint_dir"]) / "members.log").read_text().split("\n")[:-1]
    assert [m.split()[:2] for m in members] == [["0", "0"], ["1", "1"], ["2", "1"]]
    assert [a["number"] for a in record["attempts"]] == [0, 1, 2]
    ends = [a["ended_at"] for a in record["attempts"]]
    starts = [a["started_at"] for a in record["attempts"]]
    assert starts[1] >= ends[0] and starts[2] >= ends[1]

    stopped = _until_ended(hpc, early["run_id"])
    assert stopped["state"] == "COMPLETED", stopped
    assert [a["ended"] for a in stopped["attempts"]] == ["done: the program wrote its done marker"]
    states = hpc.cmd(
        ["sacct", "-c", "-n", "-P", "-j", ",".join(stopped["job_ids"]), "-o", "JobID,State"]
    ).stdout
    for job in stopped["job_ids"][1:]:
        assert f"{job}|CANCELLED" in states or not hpc.cmd(["squeue", "-h", "-j", job]).stdout
    assert testbed.jobs_from(hpc.cwd) == []
