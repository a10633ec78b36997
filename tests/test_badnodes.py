"""--preflight and --spares without Slurm: the refusals, node/preflight.py's checks and
judgements, the batch script run by bash against stand-ins for srun, sinfo and scontrol
(a node fault -> the step again on the spare; no spare left -> requeue around the bad
nodes, or fail naming them), and the record's view. On the testbed:
tests/test_e2e_badnodes.py and (a node crashed) tests/test_e2e_badnodes_crash.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from builders import cli_spec
from hpclaunch import node
from hpclaunch.config.jobspec import ContainerJob
from hpclaunch.config.profiles import load_profile
from hpclaunch.errors import UserError
from hpclaunch.node import preflight
from hpclaunch.records import runrecord
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import badnodes
from hpclaunch.script.render import plan_batch
from hpclaunch.script.runfolder import write_files

DOUBLES = Path(__file__).parent / "doubles" / "gpu"


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def _error(values: Mapping[str, Any], cluster: str = "slurm", step: bool = False) -> str:
    with pytest.raises(UserError) as info:
        cli_spec(values, cluster, step)
    return info.value.line()


@pytest.mark.parametrize(
    ("values", "cluster", "step", "expected"),
    [
        ({"spares": 1}, "local", False, "--spares: not for a local run"),
        ({"preflight": True}, "local", False, "--preflight: not for a local run"),
        ({"spares": 1}, "slurm", True, "--spares: not for a step of the current allocation"),
        ({"spares": -1}, "slurm", False, "--spares: -1 (0 to 1024)"),
        ({"spares": 1, "launcher": "torchrun"}, "slurm", False, "--spares: 1 with --launcher"),
        ({"spares": 1, "stage": ("d",)}, "slurm", False, "--spares: 1 with --stage/--stage-out"),
    ],
)
def test_refusals(values: dict[str, Any], cluster: str, step: bool, expected: str) -> None:
    assert _error(values, cluster, step).startswith("hpclaunch: error: " + expected)


def test_spares_ask_for_more_nodes_and_no_kill_and_keep_the_ranks_layout(tmp_path: Path) -> None:
    script = _script(tmp_path, {"nodes": 2, "spares": 1})
    assert "#SBATCH --nodes=3\n" in script and "#SBATCH --no-kill\n" in script
    assert "--nodes=2 \\\n" in script and "--ntasks=2 \\\n" in script
    assert '--exclude="${HPCLAUNCH_AVOID}" \\\n' in script  # empty: no node excluded
    watch = ["{ sleep 1; exec srun --overlap --nodes=2 python3 gpu_watch.py; } &"]
    assert badnodes.watch_lines(cli_spec({"spares": 1}, "slurm"), watch) == [
        '{ sleep 1; exec srun --exclude="$HPCLAUNCH_AVOID" --overlap --nodes=2 python3 '
        "gpu_watch.py; } &"
    ]
    plain = _script(tmp_path / "plain", {"nodes": 2})
    assert "#SBATCH --nodes=2\n" in plain
    assert "no-kill" not in plain and "HPCLAUNCH_PLACE" not in plain and "--ntasks=" not in plain
    assert (tmp_path / "run" / "preflight.py").exists()
    # --preflight with a later attempt: the batch shell outlives a lost node to exclude it.
    later = _script(tmp_path / "later", {"nodes": 2, "preflight": True, "requeue": True})
    assert "#SBATCH --no-kill\n" in later and "#SBATCH --nodes=2\n" in later
    assert "no-kill" not in _script(tmp_path / "pre", {"nodes": 2, "preflight": True})
    assert not (tmp_path / "plain" / "run" / "preflight.py").exists()


# ------------------------------------------------------------------ node/preflight.py
def test_judge_blames_the_node_with_the_problem_or_the_silent_one() -> None:
    fine = {"rank": 1, "problems": []}
    judged = preflight.judge(
        {
            "n1": {"rank": 0, "problems": []},
            "n2": {"rank": 1, "problems": [["gpus", "nvidia-smi lists 0 of 1 GPUs"]]},
            "n3": None,
            "n4": fine,
        }
    )
    assert judged == {
        "n2": "preflight: nvidia-smi lists 0 of 1 GPUs",
        "n3": "preflight: no answer from the node",
    }
    # The listening node is bad: the others' all-reduce failures are its fault.
    judged = preflight.judge(
        {
            "n1": {"rank": 0, "problems": [["local", "disk full"]]},
            "n2": {"rank": 1, "problems": [["allreduce", "no all-reduce with n1"]]},
        }
    )
    assert judged == {"n1": "preflight: disk full"}
    # It is not: a node that could not join is.
    judged = preflight.judge(
        {
            "n1": {"rank": 0, "problems": [["allreduce", "1 of 2 nodes joined"]]},
            "n2": {"rank": 1, "problems": [["allreduce", "no all-reduce with n1"]]},
        }
    )
    assert judged == {"n2": "preflight: no all-reduce with n1"}


def test_placement_keeps_off_bad_nodes_and_the_batch_host_while_a_spare_is_left() -> None:
    nodes = ["n1", "n2", "n3"]
    assert preflight.avoid_list(nodes, 2, [], "n1") == ["n1"]
    assert preflight.avoid_list(nodes, 2, ["n2"], "n1") == ["n2"]  # the batch host is needed
    assert preflight.avoid_list(nodes, 3, [], "n1") == []
    assert preflight.avoid_list(nodes, 2, ["n2", "n3"], "n1") is None


def _check(out: Path, rank: int, world: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-I", "-S", str(node.path(node.PREFLIGHT)), "check"]
    argv += ["--out", str(out), "--gpus", "1", "--local", str(out)]
    given = {**env, "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world)}
    # The first node's name is where the others connect: one this machine resolves.
    name = "localhost" if rank == 0 else f"n{rank + 1}"
    return subprocess.Popen(argv, env={**given, "SLURMD_NODENAME": name})


def test_check_runs_the_all_reduce_and_finds_the_unusable_gpu(tmp_path: Path) -> None:
    pattern = tmp_path / "gpus.json"
    gpu = {"samples": [[90, 100, 200.0]]}
    pattern.write_text(json.dumps({"gpus": [gpu], "nodes": {"n2": []}}))
    env = {
        "PATH": f"{DOUBLES}:{os.environ['PATH']}",
        "HPCLAUNCH_FAKE_GPU_PATTERN": str(pattern),
        "CUDA_VISIBLE_DEVICES": "0",
    }
    procs = [_check(tmp_path, rank, 2, env) for rank in (0, 1)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    n1 = json.loads((tmp_path / "localhost.json").read_text())
    n2 = json.loads((tmp_path / "n2.json").read_text())
    assert n1["ok"] and n1["problems"] == [], n1
    assert n2["problems"] == [["gpus", "nvidia-smi lists 0 of 1 GPUs"]], n2
    events = tmp_path / "events.jsonl"
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(node.path(node.PREFLIGHT)), "verdict", "--out",
         str(tmp_path), "--nodes", "localhost,n2,n3", "--events", str(events), "--attempt", "2"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "n2,n3"
    assert "node n2 failed the preflight: nvidia-smi lists 0 of 1 GPUs" in done.stderr
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert [(e["event"], e["node"], e["attempt"]) for e in lines] == [
        ("node_bad", "n2", 2),
        ("node_bad", "n3", 2),
    ]


def test_check_finds_too_few_visible_gpus_and_no_room(tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CUDA_VISIBLE_DEVICES", "0")
        patch.setenv("PATH", "/nonexistent")
        assert preflight.gpu_problems(2) == [("gpus", "1 of 2 GPUs visible")]
        assert preflight.gpu_problems(1) == []  # no tool: visibility is what there is
    assert preflight.local_problems(str(tmp_path), 1) == []
    assert "below" in preflight.local_problems(str(tmp_path), 2**40)[0][1]
    assert "No such file" in preflight.local_problems(str(tmp_path / "gone"), 1)[0][1]
    [(kind, text)] = preflight.container_problems(json.dumps(["false"]))
    assert kind == "container" and text.startswith("the container did not start (exit 1)")


# ------------------------------------------------------------ the batch script in bash
FAKES = {
    # The ranks' step (the bootstrap's) fails while $FAIL_STEPS > tries so far.
    "srun": """#!/bin/bash
n=$(cat "$FAKE/steps" 2>/dev/null || echo 0); echo $((n + 1)) >"$FAKE/steps"
for a in "$@"; do case $a in --exclude=*) ex=${a#--exclude=} ;; esac; done
echo "srun exclude=${ex-} resume=${HPCLAUNCH_RESUME-} addr=${MASTER_ADDR-}" >>"$FAKE/log"
# 0 by default: srun says nothing of a lost node in its status (Slurm 22.05)
(( n < FAIL_STEPS )) && exit "${FAIL_CODE:-0}"
[ -n "${SIGNAL_SHELL-}" ] && kill -USR2 $PPID  # Slurm's --signal=B:USR2 to the batch shell
echo '{"rank": 0, "returncode": 0}' >"$HPCLAUNCH_LOG_DIR/rank-0.exit"  # the bootstrap's
exit 0
""",
    "sinfo": """#!/bin/bash
set -f
for x in $DOWN; do echo "${x/_/ }"; done
""",
    "scontrol": """#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then echo node1; echo node2; exit 0; fi
echo "scontrol $*" >>"$FAKE/log"
case $1 in release | requeue) kill -KILL $PPID ;; esac  # Slurm ends the attempt
exit 0
""",
}


def _script(tmp_path: Path, values: Mapping[str, Any]) -> str:
    spec = cli_spec({"time": 600, **values}, "slurm")
    run = tmp_path / "run"
    run.mkdir(parents=True, exist_ok=True)
    paths = RunPaths("r1", run, run / "checkpoints")
    plan = plan_batch(spec, load_profile("slurm"), paths, tmp_path)
    write_files(paths, spec, plan.script)
    return plan.script


def _run_job(
    tmp_path: Path,
    values: Mapping[str, Any],
    fail: int,
    down: str,
    fail_code: int = 0,
    extra: Mapping[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> tuple[int, str]:
    _script(tmp_path, values)
    fake = tmp_path / "fake"
    fake.mkdir()
    for name, text in FAKES.items():
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    (tmp_path / "run" / "logs").mkdir(exist_ok=True)
    env = {
        "PATH": f"{fake}:{os.environ['PATH']}", "FAKE": str(fake), "FAIL_STEPS": str(fail),
        "DOWN": down, "FAIL_CODE": str(fail_code), "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURMD_NODENAME": "node1",
        "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "HOME": str(tmp_path),
        **(extra or {}),
    }  # fmt: skip
    done = subprocess.run(
        ["bash", str(tmp_path / "run" / "job.sh"), *args], env=env, capture_output=True,
        text=True,
        timeout=120, check=False,
    )  # fmt: skip
    return done.returncode, (fake / "log").read_text() + done.stdout + done.stderr


def test_a_node_fault_restarts_the_step_on_the_spare_with_resume(tmp_path: Path) -> None:
    code, out = _run_job(tmp_path, {"nodes": 1, "spares": 1}, 1, "node1_allocated node2_down*")
    assert code == 0, out
    # First on node2 (the batch host node1 kept as the spare), then on node1, resumed.
    assert "srun exclude=node1 resume= addr=\n" in out, out
    assert "srun exclude=node2 resume=1 addr=\n" in out, out
    assert "node(s) node2 failed during the ranks' step" in out
    record = runrecord.load(tmp_path / "run").to_dict()
    assert record["bad_nodes"] == {"node2": "node fault: Slurm shows it down"}
    assert record["step_restarts"] == [{"attempt": 0, "try": 1, "lost": "node2"}]


def test_a_failed_program_is_not_a_node_fault(tmp_path: Path) -> None:
    logs = tmp_path / "run" / "logs"
    logs.mkdir(parents=True)
    (logs / "rank-0.exit").write_text('{"rank": 0, "returncode": 3}')
    os.utime(logs / "rank-0.exit", (2e9, 2e9))  # written after the step started
    code, out = _run_job(tmp_path, {"nodes": 1, "spares": 1}, 1, "node1_allocated", 1)
    assert code == 1, out
    assert out.count("srun exclude") == 1, out
    assert "bad_nodes" not in runrecord.load(tmp_path / "run").to_dict()


def test_no_spare_left_fails_naming_the_nodes(tmp_path: Path) -> None:
    code, out = _run_job(tmp_path, {"nodes": 1, "spares": 1}, 9, "node1_down* node2_down*")
    assert code == 1, out
    assert "failed: node(s) node1,node2 cannot run the ranks" in out, out
    assert (tmp_path / "run" / "exclude").read_text() == "node1,node2\n"
    assert "scontrol" not in out


def test_no_spare_left_with_requeue_requeues_excluding_them(tmp_path: Path) -> None:
    values = {"nodes": 1, "spares": 1, "requeue": True, "exclude": "node9"}
    code, out = _run_job(tmp_path, values, 9, "node1_down* node2_down*")
    assert code == -9, out  # the fake `scontrol release` ends the shell, as Slurm would
    assert (
        "scontrol requeuehold 77\nscontrol update JobId=77 ExcNodeList=node9,node1,node2\n" in out
    )
    assert "scontrol release 77" in out, out
    record = runrecord.load(tmp_path / "run").to_dict()
    assert record["exclude"] == "node9,node1,node2"
    assert record["attempts"][0]["ended"] == "requeued by hpclaunch (bad nodes excluded)"


def test_chain_members_after_this_one_exclude_the_bad_nodes(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "chain.jobs").write_text("77\n78\n79\n")
    code, out = _run_job(
        tmp_path, {"nodes": 1, "spares": 1, "chain": 3}, 9, "node1_down* node2_down*"
    )
    assert code == 1, out
    assert "scontrol update JobId=78 ExcNodeList=node1,node2\n" in out, out
    assert "scontrol update JobId=79 ExcNodeList=node1,node2\n" in out, out
    [attempt] = runrecord.load(tmp_path / "run").to_dict()["attempts"]
    assert (attempt["ended"], attempt["exit_code"]) == ("ended", 1), attempt


def test_preflight_starts_the_container_on_each_node(tmp_path: Path) -> None:
    spec = cli_spec({"time": 600, "nodes": 2, "preflight": True}, "slurm")
    job = ContainerJob(runtime="apptainer", command="apptainer", image="/img.sif", cwd="/w")
    run = tmp_path / "run"
    paths = RunPaths("r1", run, run / "checkpoints")
    script = plan_batch(replace(spec, container=job), load_profile("slurm"), paths, tmp_path).script
    [line] = [ln for ln in script.splitlines() if " check --out " in ln]
    given = shlex.split(line.split(" check ", 1)[1])
    argv = json.loads(given[given.index("--container") + 1])
    assert argv == ["apptainer", "exec", "--cleanenv", "--pwd", "/w", "/img.sif", "true"]
    [(kind, text)] = preflight.container_problems(json.dumps(["sh", "-c", "echo no >&2; exit 3"]))
    assert (kind, text) == ("container", "the container did not start (exit 3): no")


def test_a_program_ended_when_every_rank_wrote_its_exit_since_the_step_began(
    tmp_path: Path,
) -> None:
    (tmp_path / "rank-0.exit").write_text('{"rank": 0, "returncode": 1}')
    assert not preflight.program_ended(str(tmp_path), 2, 0.0)  # rank 1's node died
    (tmp_path / "rank-1.exit").write_text('{"rank": 1, "returncode": -15}')
    assert preflight.program_ended(str(tmp_path), 2, 0.0)  # srun ended it: still written
    assert not preflight.program_ended(str(tmp_path), 2, 4e9)  # an earlier try's files


# ------------------------------------- --requeue/--chain alone: a node lost by an attempt
def _lost_attempt_zero(tmp_path: Path) -> None:
    """Attempt 0 started on node1 and wrote no end: its batch shell died with the node."""
    (tmp_path / "run").mkdir()
    start = {"event": "attempt_start", "attempt": 0, "job_id": "77", "nodes": "node1"}
    (tmp_path / "run" / "events.jsonl").write_text(json.dumps(start) + "\n")


def test_requeue_alone_names_the_node_a_killed_attempt_lost_and_requeues_without_it(
    tmp_path: Path,
) -> None:
    _lost_attempt_zero(tmp_path)
    values = {"nodes": 1, "requeue": True, "signal_before": 16, "exclude": "node9"}
    extra = {"SLURM_RESTART_COUNT": "1", "SIGNAL_SHELL": "1"}
    code, out = _run_job(tmp_path, values, 0, "node1_down* node2_allocated", extra=extra)
    assert code == -9, out  # the fake `scontrol release` ends the shell, as Slurm would
    assert "the previous attempt lost a node; later attempts exclude node9,node1" in out, out
    # Slurm's time-limit signal: hpclaunch's own requeue carries the exclusion.
    assert (
        "scontrol requeuehold 77\nscontrol update JobId=77 ExcNodeList=node9,node1\n"
        "scontrol release 77\n"
    ) in out, out
    record = runrecord.load(tmp_path / "run").to_dict()
    assert record["bad_nodes"] == {
        "node1": "node fault: Slurm showed it down after attempt 0 ended without its batch shell"
    }
    assert record["exclude"] == "node9,node1"
    assert (tmp_path / "run" / "exclude").read_text() == "node9,node1\n"
    first, second = (a["ended"] for a in record["attempts"])
    assert first == "requeued by Slurm", record["attempts"]
    assert second.startswith("requeued by hpclaunch ("), record["attempts"]  # signalled early


def test_requeue_alone_excludes_nothing_when_no_node_of_the_attempt_is_down(
    tmp_path: Path,
) -> None:
    _lost_attempt_zero(tmp_path)
    extra = {"SLURM_RESTART_COUNT": "1", "SIGNAL_SHELL": "1"}
    values = {"nodes": 1, "requeue": True, "signal_before": 16}
    code, out = _run_job(tmp_path, values, 0, "node1_idle", extra=extra)  # preempted, say
    assert code == -9, out
    assert "scontrol requeue 77\n" in out and "requeuehold" not in out, out
    record = runrecord.load(tmp_path / "run").to_dict()
    assert "bad_nodes" not in record and "exclude" not in record, record
    assert not (tmp_path / "run" / "exclude").exists()


def test_chain_alone_excludes_the_node_a_member_lost_from_the_later_members(
    tmp_path: Path,
) -> None:
    _lost_attempt_zero(tmp_path)
    (tmp_path / "run" / "chain.jobs").write_text("76\n77\n78\n")
    values = {"nodes": 1, "chain": 3}
    code, out = _run_job(tmp_path, values, 0, "node1_down*", args=("1",))
    assert code == 0, out
    assert "scontrol update JobId=78 ExcNodeList=node1\n" in out, out
    assert "JobId=77" not in out and "JobId=76" not in out, out
    record = runrecord.load(tmp_path / "run").to_dict()
    assert list(record["bad_nodes"]) == ["node1"] and record["exclude"] == "node1", record


def test_only_an_attempt_without_its_end_has_lost_nodes(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    lines = [
        {"event": "attempt_start", "attempt": 0, "nodes": "node[1-2]"},
        {"event": "rank_start", "attempt": 0},
        {"event": "attempt_end", "attempt": 0, "reason": "requeued"},
        {"event": "attempt_start", "attempt": 1, "nodes": "node3"},
    ]
    events.write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"cut')
    assert preflight.previous_nodes(str(events), 0) == ""  # its shell wrote its end
    assert preflight.previous_nodes(str(events), 1) == "node3"
    assert preflight.previous_nodes(str(events), 2) == ""
    assert preflight.previous_nodes(str(tmp_path / "none"), 0) == ""
