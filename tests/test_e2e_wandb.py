"""W&B on the testbed: the real wandb package offline through `hpclaunch run`, and
`hpclaunch sweep --wandb-sweep` with the stand-in agent (tests/doubles/wandb: the W&B
service cannot be reached from here, so what the real service decides, the parameters of
each run, comes from a local sweep file; see tests/doubles/README.md)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from builders import skip_without
from conftest import PROGRAMS, VENV_BIN, Hpc

pytestmark = pytest.mark.testbed

TRAIN = str(PROGRAMS / "wandb_train.py")
DOUBLES = Path(__file__).parent / "doubles"
KEY = "0123456789abcdef0123456789abcdef01234567"  # W&B keys are 40 hex digits


def _files_holding(root: Path, text: str) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if text.encode() in path.read_bytes():
                    found.append(str(path))
            except OSError:
                pass
    return found


def test_real_wandb_offline_through_run_keeps_the_key_secret(hpc: Hpc) -> None:
    skip_without("wandb")
    out = hpc.folder("out")
    proc = hpc.run(
        "run", "--wait", "--env", "WANDB_MODE=offline", "--",
        str(VENV_BIN / "python"), TRAIN, str(out), "--lr", "0.5",
        env={"WANDB_API_KEY": KEY}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report-0.json").read_text())
    assert report["key_seen"] and not report["key_in_cmdline"]
    offline = list((out / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and report["run_dir"].startswith(str(offline[0]))
    assert _files_holding(hpc.cwd, KEY) == []  # not in the run folder, logs, W&B's files


def test_wandb_sweep_points_run_one_agent_each_on_two_nodes(hpc: Hpc) -> None:
    skip_without("wandb")
    out = hpc.folder("out")
    data = hpc.folder("data")
    (data / "shard-0.bin").write_bytes(b"\0" * 1024)
    server = hpc.folder("wandb-server")
    (server / "ent" / "proj").mkdir(parents=True)
    sweep = {
        "program": TRAIN,
        "method": "grid",
        "parameters": {"lr": {"values": [0.1, 0.2, 0.3]}},
        "command": ["hpclaunch", "run", "--", "${interpreter}", "${program}", str(out), "${args}"],
    }
    (server / "ent" / "proj" / "sw1.json").write_text(json.dumps(sweep))
    for path in (server, server / "ent", server / "ent" / "proj"):
        os.chown(path, hpc.cwd.stat().st_uid, hpc.cwd.stat().st_gid)
    env = {
        "PATH": f"{DOUBLES}:{hpc.env['PATH']}",
        "WANDB_DOUBLE_SWEEPS": str(server),
        "WANDB_API_KEY": KEY,
    }
    proc = hpc.run(
        "sweep", "--wandb-sweep", "ent/proj/sw1", "--count", "3", "-N", "2",
        "--tasks-per-node", "2", "--stage", str(data), "--env", "WANDB_MODE=offline",
        "--max-parallel", "1", "--wait", "--json", env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = json.loads(proc.stdout.splitlines()[0])
    runs = [json.loads(x) for x in (server / "ent/proj/sw1.runs.jsonl").read_text().splitlines()]
    assert len(runs) == 3  # one agent run per point
    reports = {p.name: json.loads(p.read_text()) for p in out.glob("report-p*-*.json")}
    assert len(reports) == 12  # 3 points x 4 ranks
    lrs = set()
    for point in range(3):
        ranks = [reports[f"report-p{point}-{r}.json"] for r in range(4)]
        assert len({(r["lr"], r["params"], r["run_id"], r["sweep_id"]) for r in ranks}) == 1
        assert {r["node"] for r in ranks} == {"node1", "node2"}
        assert all(r["data"] == ["shard-0.bin"] for r in ranks)  # staged on both nodes
        assert not any(r["key_in_cmdline"] for r in ranks) and all(r["key_seen"] for r in ranks)
        assert json.loads(ranks[0]["params"]) == {"lr": ranks[0]["lr"]}
        lrs.add(ranks[0]["lr"])
    assert lrs == {0.1, 0.2, 0.3}
    status = json.loads(hpc.run("sweep", "status", line["sweep_id"], "--json").stdout)
    assert [p["state"] for p in status["points"]] == ["COMPLETED"] * 3
    assert sorted(p["params"]["lr"] for p in status["points"]) == [0.1, 0.2, 0.3]
    assert _files_holding(hpc.cwd, KEY) == []


def test_wandb_sweep_refusals(hpc: Hpc) -> None:
    creds = hpc.cwd / "creds.txt"
    creds.write_text(KEY + "\n")
    os.chown(creds, hpc.cwd.stat().st_uid, hpc.cwd.stat().st_gid)  # the user's own file
    creds.chmod(0o644)
    profile = hpc.cwd / "hpclaunch.toml"
    profile.write_text(
        '[sweep]\nwandb_sweep = "ent/proj/other"\n'
        f'[clusters.slurm]\nwandb_credentials = "{creds}"\n'
    )
    env = {"PATH": f"{DOUBLES}:{hpc.env['PATH']}"}
    proc = hpc.run("sweep", "--wandb-sweep", "ent/proj/sw1", "--count", "2", "--dry-run",
                   env=env)  # fmt: skip
    assert proc.returncode == 2 and "chmod 600" in proc.stderr, proc.stderr
    creds.chmod(0o600)
    proc = hpc.run("sweep", "--wandb-sweep", "ent/proj/sw1", "--count", "2", "--dry-run",
                   env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ent/proj/other" in proc.stderr and "ent/proj/sw1" in proc.stderr  # one warning
    assert KEY not in proc.stdout + proc.stderr and "WANDB_API_KEY" in proc.stdout
    no_wandb = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    argv = [str(VENV_BIN / "hpclaunch"), "sweep", "--wandb-sweep", "ent/proj/sw1", "--count", "2"]
    proc = hpc.cmd(argv, env=no_wandb)
    assert proc.returncode == 2 and "wandb" in proc.stderr and len(proc.stderr.splitlines()) == 1


def _server(hpc: Hpc, out: Path, values: list[float]) -> Path:
    server = hpc.folder("wandb-server")
    (server / "ent" / "proj").mkdir(parents=True)
    sweep = {
        "program": TRAIN,
        "method": "grid",
        "parameters": {"lr": {"values": values}},
        "command": ["hpclaunch", "run", "--", "${interpreter}", "${program}", str(out), "${args}"],
    }
    (server / "ent" / "proj" / "sw1.json").write_text(json.dumps(sweep))
    for path in (server, server / "ent", server / "ent" / "proj"):
        os.chown(path, hpc.cwd.stat().st_uid, hpc.cwd.stat().st_gid)
    return server


def test_wandb_from_a_setup_line_runs_the_agent_where_the_job_runs(hpc: Hpc) -> None:
    """Issue #28 item 5: `wandb` only on the PATH a --setup line makes (as `module load`
    or a venv activated there does), not the submitting one; the agent sees the run's
    --env values (the double's sweep folder comes only through --env). Before, the
    submission was refused: no `wandb` on PATH."""
    skip_without("wandb")
    out = hpc.folder("out")
    server = _server(hpc, out, [0.1, 0.2])
    proc = hpc.run(
        "sweep", "--wandb-sweep", "ent/proj/sw1", "--count", "2",
        "--setup", f"export PATH={DOUBLES}:$PATH",
        "--env", f"WANDB_DOUBLE_SWEEPS={server}", "--env", "WANDB_MODE=offline",
        "--wait", "--json", env={"WANDB_API_KEY": KEY}, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "`wandb` is looked for where each point runs" in proc.stderr
    runs = [json.loads(x) for x in (server / "ent/proj/sw1.runs.jsonl").read_text().splitlines()]
    assert len(runs) == 2 and all(r["argv"][:3] == ["hpclaunch", "run", "--"] for r in runs)
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("report-p*-0.json"))]
    assert sorted(r["lr"] for r in reports) == [0.1, 0.2]
    assert all(r["run_id"] and r["sweep_id"] == "sw1" and r["key_seen"] for r in reports)
    assert {r["run_id"] for r in reports} == {r["run_id"] for r in runs}
    assert _files_holding(hpc.cwd, KEY) == []


def test_a_point_without_wandb_where_the_job_runs_fails_saying_so(hpc: Hpc) -> None:
    out = hpc.folder("out")
    argv = [
        str(VENV_BIN / "hpclaunch"), "sweep", "--wandb-sweep", "ent/proj/sw1", "--count", "1",
        "--setup", "true", "--wait", "--json", "--", "python3", str(out),
    ]  # fmt: skip
    no_wandb = {"WANDB_API_KEY": KEY, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    proc = hpc.cmd(argv, env=no_wandb, timeout=300)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    line = json.loads(proc.stdout.splitlines()[0])
    batch = next(hpc.cwd.rglob(f"{line['sweep_id']}/points/0/logs/batch.out")).read_text()
    assert "hpclaunch: no `wandb` where this point's job runs" in batch, batch
    assert "the W&B agent ended without handing over the sweep's command" in batch, batch


REPORT = """import json, os, sys
out = sys.argv[1]
keys = ("HPCLAUNCH_PARAMS", "WANDB_RUN_ID", "WANDB_SWEEP_ID", "HPCLAUNCH_POINT", "FROM_ENV")
report = {k: os.environ.get(k) for k in keys}
report["args"] = sys.argv[2:]
report["in_image"] = os.path.exists("/hpclaunch-test-image")
with open(os.path.join(out, "report-%s.json" % os.environ["RANK"]), "w") as fh:
    json.dump(report, fh)
"""


def test_wandb_only_inside_the_image_runs_the_agent_there(hpc: Hpc, user_image: Path) -> None:
    """Issue #28 item 5: `wandb` exists only in the image (no hpclaunch, no srun there);
    the agent runs inside it and its `hpclaunch run -- ...` hands the program line to the
    batch shell, whose job.sh starts the ranks in the image with the parameters."""
    shutil.copyfile(DOUBLES / "wandb", user_image / "usr/local/bin/wandb")
    (user_image / "usr/local/bin/wandb").chmod(0o755)
    assert not (user_image / "usr/local/bin/hpclaunch").exists()
    out = hpc.folder("out")
    program = hpc.cwd / "report.py"
    program.write_text(REPORT)
    server = hpc.folder("wandb-server")
    (server / "ent" / "proj").mkdir(parents=True)
    sweep = {
        "program": str(program),
        "method": "grid",
        "parameters": {"lr": {"values": [0.5]}},
        "command": ["hpclaunch", "run", "--", "python3", "${program}", str(out), "${args}"],
    }
    (server / "ent" / "proj" / "sw1.json").write_text(json.dumps(sweep))
    for path in (server, server / "ent", server / "ent" / "proj"):
        os.chown(path, hpc.cwd.stat().st_uid, hpc.cwd.stat().st_gid)
    proc = hpc.run(
        "sweep", "--wandb-sweep", "ent/proj/sw1", "--count", "1",
        "--container", str(user_image), "--container-runtime", "charliecloud",
        "--env", f"WANDB_DOUBLE_SWEEPS={server}", "--env", "FROM_ENV=yes",
        "--wait", "--json", env={"WANDB_API_KEY": KEY}, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"inside {user_image}" in proc.stderr
    runs = [json.loads(x) for x in (server / "ent/proj/sw1.runs.jsonl").read_text().splitlines()]
    assert len(runs) == 1 and runs[0]["exit_code"] == 0
    report = json.loads((out / "report-0.json").read_text())
    assert report["in_image"] and report["FROM_ENV"] == "yes"
    assert report["args"] == ["--lr=0.5"] and json.loads(report["HPCLAUNCH_PARAMS"]) == {"lr": 0.5}
    assert report["WANDB_RUN_ID"] == runs[0]["run_id"] and report["WANDB_SWEEP_ID"] == "sw1"
    assert runs[0]["wandb_env"].get("WANDB_DOUBLE_SWEEPS") == str(server)  # the agent saw --env
