"""A user's script driving hpclaunch through its Python API (run by tests/test_api.py
locally and as the testbed's user): prints one JSON object with what it saw."""

import json
import sys
from pathlib import Path

import hpclaunch

cluster, nodes = sys.argv[1], int(sys.argv[2])
here = Path(__file__).resolve().parent
program = ["python3", str(here / "result_writer.py"), "--lr", "3e-4"]
run = hpclaunch.run(program, cluster=cluster, nodes=nodes, tasks_per_node=2, no_snapshot=True)
code = run.wait(timeout=240)
seen = {
    "id": run.id,
    "code": code,
    "state": run.state,
    "result": run.result(),
    "logs": run.logs(),
    "rank1": run.logs(rank=1),
    "last": hpclaunch.get("last").id,
    "listed": [r.id for r in hpclaunch.runs(state="COMPLETED")],
}
sleeper = hpclaunch.run(["sleep", "300"], cluster=cluster, no_snapshot=True)
sleeper.cancel()
seen["cancelled"] = [sleeper.wait(timeout=120), sleeper.state]
try:
    hpclaunch.run(["true"], cluster=cluster, nodes="2")  # type: ignore[arg-type]
except hpclaunch.UserError as exc:
    seen["wrong_type"] = str(exc)
print(json.dumps(seen))
