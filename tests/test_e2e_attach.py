"""`hpclaunch attach` on the real two-node testbed: a command on a chosen node of a
running job, inside its container, on a sweep point; ended and pending runs refused."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import testbed
from conftest import Hpc

pytestmark = pytest.mark.testbed


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _blocked(hpc: Hpc) -> tuple[Path, list[str]]:
    """A program that runs until the file `release` appears in the shared folder."""
    release = hpc.cwd / "release"
    return release, ["bash", "-c", f"until [ -e {release} ]; do sleep 0.2; done"]


def _ranks_started(run_dir: Path, count: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            text = (run_dir / "events.jsonl").read_text()
        except OSError:
            return False
        return text.count('"rank_start"') >= count

    return check


def _start(hpc: Hpc, *options: str) -> tuple[dict[str, Any], Path]:
    release, program = _blocked(hpc)
    proc = hpc.run("run", "--json", "-N", "2", *options, "--", *program)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started = json.loads(proc.stdout.splitlines()[-1])
    try:  # side by side with other tests' jobs, the job may wait minutes for the nodes
        _wait_for("both ranks to start", _ranks_started(Path(started["run_dir"]), 2), 600)
    except BaseException:
        release.write_text("")  # never leave the job holding the nodes for the next tests
        raise
    return started, release


def _status(hpc: Hpc, run: str) -> dict[str, Any]:
    proc = hpc.run("status", run, "--json")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _refused(hpc: Hpc, *args: str) -> str:
    proc = hpc.run("attach", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpclaunch: error: "), proc.stderr
    return lines[0]


def _hostname(node: str) -> str:
    """What `hostname` prints on a node: its own name in the namespace layout."""
    return node if testbed.layout() == "netns" else ""


def test_attach_runs_on_the_chosen_node_and_is_refused_once_the_run_ended(hpc: Hpc) -> None:
    started, release = _start(hpc)
    run_id, run_dir = started["run_id"], started["run_dir"]
    try:
        second = hpc.run("attach", run_id, "--node", "node2", "--", "hostname")
        assert second.returncode == 0, second.stdout + second.stderr
        if _hostname("node2"):
            assert second.stdout.strip() == "node2", second.stdout
        probe = "echo $SLURMD_NODENAME $SLURM_JOB_ID $HPCLAUNCH_RUN_DIR $PWD; exit 3"
        proc = hpc.run("attach", run_id, "--json", "--", "sh", "-c", probe)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        shown = json.loads(proc.stdout)
        assert (shown["node"], shown["nodes"]) == ("node1", ["node1", "node2"]), shown
        assert (shown["exit_code"], shown["job_id"]) == (3, started["job_id"]), shown
        # The first node by default, inside the job, with the run's variables, in the
        # job's working folder.
        job_cwd = _status(hpc, run_id)["code"]["cwd"]
        assert shown["stdout"].split() == ["node1", started["job_id"], run_dir, job_cwd], shown
        line = _refused(hpc, run_id, "--node", "node9", "--", "true")
        assert "--node: 'node9' is not a node of job" in line and "node1, node2" in line, line
        line = _refused(hpc, run_id, "--container", "--", "true")
        assert "runs without a container" in line, line
        assert _status(hpc, run_id)["state"] == "RUNNING"
    finally:
        release.write_text("")
    _wait_for("the run to end", lambda: _status(hpc, run_id)["state"] == "COMPLETED")
    assert _status(hpc, run_id)["exit_code"] == 0  # the attached steps changed nothing
    line = _refused(hpc, run_id, "--", "hostname")
    assert f"RUN: {run_id} has already ended (COMPLETED)" in line, line


def test_attach_container_runs_inside_the_image(hpc: Hpc, user_image: Path) -> None:
    started, release = _start(
        hpc, "--container", str(user_image), "--container-runtime", "charliecloud"
    )
    run_id, run_dir = started["run_id"], started["run_dir"]
    try:
        probe = "cat /hpclaunch-test-image; echo $HPCLAUNCH_RUN_DIR; echo $CH_RUNNING; hostname"
        proc = hpc.run("attach", run_id, "--container", "--node", "node2", "--", "sh", "-c", probe)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[:3] == ["yes", run_dir, "Weird Al Yankovic"], proc.stdout
        if _hostname("node2"):
            assert lines[3] == "node2", proc.stdout
        # Without --container: the node itself, where the image's marker is not.
        host = hpc.run(
            "attach", run_id, "--node", "node2", "--", "test", "-e", "/hpclaunch-test-image"
        )
        assert host.returncode == 1, host.stdout + host.stderr
    finally:
        release.write_text("")
    _wait_for("the run to end", lambda: _status(hpc, run_id)["state"] == "COMPLETED")


def test_attach_a_pending_run_is_refused(hpc: Hpc) -> None:
    proc = hpc.run("run", "--json", "--sbatch-arg=--begin=now+1hour", "--", "true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    try:
        line = _refused(hpc, run_id, "--", "hostname")
        assert f"RUN: {run_id} is pending (PENDING" in line, line
    finally:
        hpc.run("cancel", run_id)


def test_attach_a_sweep_point(hpc: Hpc) -> None:
    release, program = _blocked(hpc)
    proc = hpc.run("sweep", "--json", "-N", "2", "--grid", "x=a", "--", *program)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep_id = json.loads(proc.stdout.splitlines()[0])["sweep_id"]
    point_dir = next((hpc.cwd / "runs").glob(f"*/{sweep_id}")) / "points" / "0"  # its task makes it
    try:
        _wait_for("the point's ranks to start", _ranks_started(point_dir, 2))
        proc = hpc.run("attach", f"{sweep_id}:0", "--node", "node2", "--json", "--", "hostname")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        shown = json.loads(proc.stdout)
        assert (shown["run_id"], shown["node"]) == (f"{sweep_id}:0", "node2"), shown
        assert shown["job_id"].isdigit(), shown  # srun takes the task's own id only
        if _hostname("node2"):
            assert shown["stdout"].strip() == "node2", shown
    finally:
        release.write_text("")
    _wait_for("the point to end", lambda: _status(hpc, f"{sweep_id}:0")["state"] == "COMPLETED")


def test_attach_on_a_terminal_is_an_interactive_shell(hpc: Hpc) -> None:
    """On a terminal (script(1) gives it one) hpclaunch becomes `srun --pty`: the shell
    reads the terminal, and its exit status is hpclaunch's."""
    started, release = _start(hpc)
    run_id = started["run_id"]
    try:
        typed = "tty; echo on-$SLURMD_NODENAME; exit 5\n"
        proc = subprocess.run(
            ["runuser", "-u", testbed.USER, "--", "script", "-qec",
             f"hpclaunch attach {run_id} --node node2", "/dev/null"],
            input=typed, cwd=hpc.cwd, env=hpc.env, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 5, proc.stdout + proc.stderr
        assert "on-node2" in proc.stdout and "/dev/pts/" in proc.stdout, proc.stdout
        # No terminal and no COMMAND: the shell reads hpclaunch's stdin.
        piped = subprocess.run(
            ["runuser", "-u", testbed.USER, "--", "hpclaunch", "attach", run_id],
            input="tty || echo no-tty; echo on-$SLURMD_NODENAME; exit 3\n", cwd=hpc.cwd,
            env=hpc.env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert piped.returncode == 3, piped.stdout + piped.stderr
        assert piped.stdout.splitlines()[-2:] == ["no-tty", "on-node1"], piped.stdout
    finally:
        release.write_text("")
    _wait_for("the run to end", lambda: _status(hpc, run_id)["state"] == "COMPLETED")
