"""`sweep --pack` with what a plain run has around its ranks, on the testbed (2 nodes x 2
fake GPUs): `--stage` staged once per node for every point, `--container` (Charliecloud)
entered by every point's ranks, a W&B sweep (the stand-in agent, tests/doubles/wandb) run
by one agent per slot. Short points, one allocation each."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from conftest import PROGRAMS, Hpc

pytestmark = pytest.mark.testbed

DOUBLES = Path(__file__).parent / "doubles"  # the W&B stand-in agent
KEY = "0123456789abcdef0123456789abcdef01234567"
PACK = ("sweep", "--json", "--pack", "-N", "2", "--gpus-per-node", "2", "--repeat", "4")


def _sweep(hpc: Hpc, *args: str) -> dict[str, Any]:
    proc = hpc.run(*PACK, "--wait", *args, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.splitlines()[0]))


def _events(folder: Path) -> list[dict[str, Any]]:
    path = folder / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_four_points_on_two_nodes_read_data_staged_once_per_node(hpc: Hpc) -> None:
    data = hpc.folder("data") / "words.txt"
    data.write_text("staged once\n")
    out = hpc.folder("out")
    line = _sweep(hpc, "--stage", str(data), "--", "python3", str(PROGRAMS / "pack_point.py"),
                  str(out), "0")  # fmt: skip
    seen = [json.loads(p.read_text()) for p in sorted(out.glob("p*-r0-t1.json"))]
    assert len(seen) == 4 and {s["data"] for s in seen} == {"staged once\n"}
    sweep_dir = Path(line["sweep_dir"])
    starts = [e for i in range(4) for e in _events(sweep_dir / "points" / str(i))
              if e["event"] == "point_start"]  # fmt: skip
    assert len({e["node"] for e in starts}) == 2  # the points ran on both nodes
    # one guard per node: unpacked once there, removed at the end
    events = _events(sweep_dir)
    ready = [e["node"] for e in events if e["event"] == "stage_ready"]
    done = [(e["node"], e["ok"]) for e in events if e["event"] == "stage_done"]
    assert sorted(ready) == sorted({e["node"] for e in starts})
    assert sorted(done) == [(n, True) for n in sorted(ready)]
    # every point of a node read the one copy there, never its own scratch
    by_node: dict[str, set[str]] = {}
    for record in seen:
        by_node.setdefault(record["env"]["SLURMD_NODENAME"], set()).add(
            record["env"]["HPCLAUNCH_DATA"]
        )
        assert not record["env"]["HPCLAUNCH_DATA"].startswith(record["env"]["HPCLAUNCH_LOCAL"])
    assert all(len(paths) == 1 for paths in by_node.values())


def test_four_points_run_inside_the_image(hpc: Hpc, user_image: Path) -> None:
    out = hpc.folder("out")
    data = hpc.folder("data") / "words.txt"
    data.write_text("staged for the image\n")
    _sweep(hpc, "--container", str(user_image), "--container-runtime", "charliecloud",
           "--stage", str(data), "--", "python3", "-c", _IN_IMAGE, str(out))  # fmt: skip
    seen = {p.name: json.loads(p.read_text()) for p in out.glob("point-*.json")}
    assert sorted(seen) == [f"point-{i}.json" for i in range(4)]
    for record in seen.values():
        assert record["marker"] == "yes\n"  # a file only the image has
        assert record["ch_running"]  # ch-run's own variable: inside the container
        assert (record["rank"], record["world"]) == ("0", "1")  # a run of its own
        assert record["gpus"] in ("0", "1")  # the slot's GPU, as without the image
        assert record["data"] == "staged for the image\n"  # the node's staged copy, inside


_IN_IMAGE = """
import json, os, sys
env = os.environ
marker = open("/hpclaunch-test-image").read() if os.path.exists("/hpclaunch-test-image") else ""
data = env["HPCLAUNCH_DATA"]
record = {"data": open(data).read() if os.path.isfile(data) else None, "marker": marker,
          "ch_running": env.get("CH_RUNNING"), "rank": env.get("RANK"),
          "world": env.get("WORLD_SIZE"), "gpus": env.get("CUDA_VISIBLE_DEVICES")}
with open(os.path.join(sys.argv[1], "point-%s.json" % env["HPCLAUNCH_POINT"]), "w") as fh:
    json.dump(record, fh)
"""


def test_a_wandb_sweep_of_six_runs_on_four_slots(hpc: Hpc) -> None:
    out = hpc.folder("out")
    server = hpc.folder("wandb-server")
    (server / "ent" / "proj").mkdir(parents=True)
    sweep = {
        "program": "x.py",
        "method": "grid",
        "parameters": {"lr": {"values": [1, 2, 3, 4, 5, 6]}},
        "command": ["hpclaunch", "run", "--", "python3", "-c", _RUN, str(out), "${args}"],
    }
    (server / "ent" / "proj" / "sw1.json").write_text(json.dumps(sweep))
    for path in (server / "ent", server / "ent" / "proj"):
        os.chown(path, hpc.cwd.stat().st_uid, hpc.cwd.stat().st_gid)
    env = {"PATH": f"{DOUBLES}:{hpc.env['PATH']}", "WANDB_DOUBLE_SWEEPS": str(server),
           "WANDB_API_KEY": KEY}  # fmt: skip
    proc = hpc.run("sweep", "--json", "--pack", "-N", "2", "--gpus-per-node", "2",
                   "--wandb-sweep", "ent/proj/sw1", "--count", "6", "--wait", env=env,
                   timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = json.loads(proc.stdout.splitlines()[0])
    runs = (server / "ent" / "proj" / "sw1.runs.jsonl").read_text().splitlines()
    assert len(runs) == 6  # every run reported to the service, and no more
    assert sorted(p.read_text() for p in out.glob("ran-*")) == [f"--lr={i}" for i in range(1, 7)]
    sweep_dir = Path(line["sweep_dir"])
    spans = []
    for index in range(6):
        events = _events(sweep_dir / "points" / str(index))
        start = next(e["time"] for e in events if e["event"] == "point_start")
        end = next(e for e in events if e["event"] == "point_end")
        assert end["exit_code"] == 0
        spans.append((start, end["time"]))
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    level = most = 0
    for _, step in edges:
        level += step
        most = max(most, level)
    assert most <= 4  # one agent per slot, never more
    status = json.loads(hpc.run("sweep", "status", line["sweep_id"], "--json").stdout)
    assert [p["state"] for p in status["points"]] == ["COMPLETED"] * 6
    assert sorted(p["params"]["lr"] for p in status["points"]) == [1, 2, 3, 4, 5, 6]


_RUN = """
import os, sys, time
time.sleep(1)
with open(os.path.join(sys.argv[1], "ran-" + os.environ["WANDB_RUN_ID"]), "w") as fh:
    fh.write(" ".join(sys.argv[2:]))
"""
