"""`sweep --pack` with what a plain run has around its ranks (issue 30): `--stage` (the data
staged once per node for every point, sweeps/packstage.py), as a dry-run's job script and
on this machine (`--cluster local`); `--container` (each point's ranks enter the image by
a plain run's task line, sweeps/packcontainer.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from test_cli import env as env
from test_cli import hpclaunch

PROGRAM = str(Path(__file__).parent / "programs" / "pack_point.py")
LUMI = ["--cluster", "lumi", "-A", "project_465000000", "-p", "standard-g", "-N", "2"]


def test_a_packed_dry_run_stages_once_per_node_before_the_agents(
    tmp_path: Path, env: dict[str, str]
) -> None:
    (tmp_path / "data.txt").write_text("staged\n")
    proc = hpclaunch(["sweep", "--dry-run", *LUMI, "--pack", "--repeat", "20", "--stage",
                      "data.txt", "--", "python", "t.py"], tmp_path, env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    sbcast = script.index("stage_bcast.py")  # the files sent to every node once
    guard = script.index("stage_node.py run")  # one guard per node, as a plain run's
    ready = script.index("(( ${#ready[@]} >= 2 )) && break")
    agents = script.index("srun --no-kill --kill-on-bad-exit=0 --nodes=2 --ntasks=2")
    ends = script.rindex('kill -USR1 "$HPCLAUNCH_STAGE_PID"')
    assert sbcast < guard < ready < agents < ends
    assert "srun --overlap --nodes=2 --ntasks=2 --ntasks-per-node=1" in script
    assert "--cpus-per-task=56 --kill-on-bad-exit=0" in script  # the node's cores, unpacking
    assert 'wait "$HPCLAUNCH_STAGE_PID"\nexit "$HPCLAUNCH_RC"\n' in script[ends:]
    # every allocation (--pack-jobs) waits on its own guards' markers
    marks = script.index("export HPCLAUNCH_STAGE_MARKS=/scratch/project_465000000/")
    assert '/stage/"${SLURM_JOB_ID}"' in script[marks : script.index("\n", marks)]
    assert 'ready=("$HPCLAUNCH_STAGE_MARKS"/ready-*)' in script
    assert marks < guard


def test_a_packed_stage_out_is_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    proc = hpclaunch(["sweep", "--dry-run", *LUMI, "--pack", "--repeat", "2", "--stage-out",
                      "out:/tmp/x", "--", "python", "t.py"], tmp_path, env)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("hpclaunch: error: --stage-out: with --pack is not supported")
    assert proc.stderr.count("\n") == 1


def test_a_requeued_pack_stages_afresh_and_ends_its_guards_before_it_exits(
    tmp_path: Path, env: dict[str, str]
) -> None:
    (tmp_path / "data.txt").write_text("staged\n")
    proc = hpclaunch(["sweep", "--dry-run", *LUMI, "-t", "1:00:00", "--requeue", "--pack",
                      "--repeat", "20", "--stage", "data.txt", "--", "python", "t.py"],
                     tmp_path, env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    fresh = script.index('rm -rf -- "$HPCLAUNCH_STAGE_MARKS"')  # not the last attempt's marks
    assert fresh < script.index("stage_node.py run")
    step = script.index("pack.json &\nHPCLAUNCH_PACK_PID=$!")
    ends = script.rindex('kill -USR1 "$HPCLAUNCH_STAGE_PID"')
    assert step < ends < script.rindex('exit "$HPCLAUNCH_RC"')


def test_a_local_pack_stages_once_for_every_point_and_removes_it(
    tmp_path: Path, env: dict[str, str]
) -> None:
    (tmp_path / "data.txt").write_text("staged\n")
    out = tmp_path / "out"
    out.mkdir()
    proc = hpclaunch(["sweep", "--cluster", "local", "--pack", "--cpus-per-point", "1",
                      "--repeat", "3", "--stage", "data.txt", "--", sys.executable, PROGRAM,
                      str(out), "0"], tmp_path, env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = [json.loads(p.read_text()) for p in sorted(out.glob("p*.json"))]
    assert len(seen) == 3 and all(s["data"] == "staged\n" for s in seen)
    paths = {s["env"]["HPCLAUNCH_DATA"] for s in seen}
    assert len(paths) == 1  # one copy for every point: staged once
    (path,) = paths
    assert all(not path.startswith(s["env"]["HPCLAUNCH_LOCAL"]) for s in seen)
    assert not os.path.exists(path)  # removed once the points were done


def test_a_packed_dry_run_shows_each_points_ranks_entering_the_image(
    tmp_path: Path, env: dict[str, str]
) -> None:
    (tmp_path / "img" / "tmp").mkdir(parents=True)  # a directory image: ch-run's kind
    proc = hpclaunch(["sweep", "--dry-run", *LUMI, "--pack", "--repeat", "2", "--container",
                      "./img", "--container-runtime", "charliecloud", "--", "python", "t.py"],
                     tmp_path, env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    rank = lines[lines.index(next(x for x in lines if x.startswith("# each rank of a point"))) + 1]
    # the task line of a plain run's rank: the runtime in front, the run root bound, the
    # variables through fd 3 to the bootstrap inside
    assert f"ch-run '--unset-env=*' --cd={tmp_path} " in rank
    assert "--bind=/scratch/project_465000000/" in rank and f" {tmp_path}/img -- " in rank
    assert rank.endswith("bootstrap.py --hpclaunch-env-fd=3 python t.py")
    # the agent runs outside the image; no step of a point's own
    assert "srun --no-kill --kill-on-bad-exit=0 --nodes=2 --ntasks=2" in proc.stdout
    assert "--container-image" not in proc.stdout


def test_a_packed_container_srun_enters_is_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "img.sqsh").write_bytes(b"hsqs")
    proc = hpclaunch(["sweep", "--dry-run", *LUMI, "--pack", "--repeat", "2", "--container",
                      "./img.sqsh", "--container-runtime", "pyxis", "--", "python", "t.py"],
                     tmp_path, env)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        "hpclaunch: error: --container-runtime: pyxis with --pack is not supported yet"
    )


DOUBLES = Path(__file__).parent / "doubles"
KEY = "0123456789abcdef0123456789abcdef01234567"


def test_a_packed_wandb_dry_run_runs_one_agent_per_point(
    tmp_path: Path, env: dict[str, str]
) -> None:
    env = {**env, "PATH": f"{DOUBLES}:{env['PATH']}"}  # the stand-in `wandb`
    args = ["sweep", "--dry-run", *LUMI, "--pack", "--wandb-sweep", "ent/proj/sw1", "--count"]
    proc = hpclaunch([*args, "6"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    rank = lines[lines.index(next(x for x in lines if x.startswith("# each rank of a point"))) + 1]
    assert "/bootstrap.py python3 -I -S " in rank and "/wandb_agent.py agent " in rank
    assert rank.endswith(" wandb agent --count 1 ent/proj/sw1")
    assert "srun --no-kill --kill-on-bad-exit=0 --nodes=2 --ntasks=2" in proc.stdout
    refused = hpclaunch([*args, "6", "--gpus-per-point", "2", "--tasks-per-point", "2"],
                        tmp_path, env)  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("hpclaunch: error: --tasks-per-point: 2 with --pack and")


def test_a_packed_points_agent_runs_the_sweeps_command_in_its_slot(tmp_path: Path) -> None:
    """node/wandb_agent.py with HPCLAUNCH_WANDB_DIRECT (what a packed point's rank runs):
    the stand-in agent's one run is the sweep's program, started here, its exit code the
    point's (the agent itself exits 0 after any run)."""
    import subprocess

    from hpclaunch import node
    from hpclaunch.records import sweeprecord

    server, point, out = tmp_path / "server", tmp_path / "points" / "3", tmp_path / "out"
    (server / "ent" / "proj").mkdir(parents=True)
    point.mkdir(parents=True)
    out.mkdir()
    program = "import os, sys; open(sys.argv[1] + '/ran', 'w').write(sys.argv[2]); sys.exit(5)"
    sweep = {"program": "x.py", "method": "grid", "parameters": {"lr": {"values": [0.1]}},
             "command": ["hpclaunch", "run", "--", sys.executable, "-c", program, str(out),
                         "${args}"]}  # fmt: skip
    (server / "ent" / "proj" / "sw1.json").write_text(json.dumps(sweep))
    run_env = {"PATH": f"{DOUBLES}:{os.environ['PATH']}", "WANDB_DOUBLE_SWEEPS": str(server),
               "WANDB_API_KEY": KEY, "HOME": str(tmp_path),
               "HPCLAUNCH_WANDB_DIRECT": "1"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(node.path(node.WANDB_AGENT)), "agent", str(point),
         "wandb", "agent", "--count", "1", "ent/proj/sw1"],
        env=run_env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 5, done.stderr
    assert (out / "ran").read_text() == "--lr=0.1"
    runs = (server / "ent" / "proj" / "sw1.runs.jsonl").read_text().splitlines()
    assert len(runs) == 1  # one run of the sweep, reported to the service
    assert json.loads((point / node.HANDOFF).read_text())["program"][0] == sys.executable
    # the point's parameters where sweep status reads them (the agent keeps its own copy
    # of the file name: it never imports hpclaunch)
    assert json.loads((point / sweeprecord.PARAMS_JSON).read_text()) == {"lr": 0.1}


def test_a_packed_points_secret_reaches_it_but_never_pack_json(
    tmp_path: Path, env: dict[str, str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    code = "import os, sys; open(sys.argv[1] + '/seen', 'w').write(os.environ['MY_API_KEY'])"
    proc = hpclaunch(["sweep", "--cluster", "local", "--pack", "--cpus-per-point", "1",
                      "--repeat", "1", "--env", "MY_API_KEY=s3cr3t-pack-42", "--",
                      sys.executable, "-c", code, str(out)], tmp_path, env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "seen").read_text() == "s3cr3t-pack-42"
    (pack_json,) = (tmp_path / "runs").rglob("pack.json")
    assert "s3cr3t-pack-42" not in pack_json.read_text()
