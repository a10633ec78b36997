"""A notebook-like user of hpclaunch.call (run by tests/test_call.py locally and as the
testbed's user): a gloo all-reduce on every rank, a rank that raises, keyword arguments
named like run options, three submits at once; prints one JSON object of what it saw."""

import json
import os
import socket
import sys
import time

import hpclaunch


def all_reduce(scale: float) -> tuple[int, int, str, float]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1) * scale])
    dist.all_reduce(value)
    seen = (dist.get_rank(), dist.get_world_size(), socket.gethostname(), value.item())
    dist.destroy_process_group()
    return seen


def in_image(site: str) -> tuple[int, int, str, float, str, bool, bool]:
    """all_reduce with the host's torch (bound at `site`), in an image without cloudpickle."""
    import subprocess

    import cloudpickle

    sys.path.append(site)
    lacks = subprocess.run([sys.executable, "-I", "-c", "import cloudpickle"], check=False)
    image = os.path.exists("/hpclaunch-test-image")
    return (*all_reduce(0.5), cloudpickle.__file__, lacks.returncode != 0, image)


def fails_on_rank_3() -> int:
    if os.environ["RANK"] == "3":
        raise ValueError("rank 3 says no")
    time.sleep(120)  # ended with the job when rank 3 fails
    return 0


def takes_run_option_names(*, nodes: int, time: str) -> str:
    return f"{nodes}/{time}/{os.environ['RANK']}"


cluster, what = sys.argv[1], sys.argv[2]
shape = {"cluster": cluster, "nodes": 2, "tasks_per_node": 2, "no_snapshot": True}
seen: dict[str, object] = {}
if what == "all_reduce":
    seen["results"] = list(hpclaunch.call(all_reduce, 0.5, options=shape))
    last = hpclaunch.get("last")
    seen["job_id"], seen["step"] = last.job_id, last.record.step
    seen["command"] = last.record.command
elif what == "image":
    image = {**shape, "container": sys.argv[3], "container_runtime": "charliecloud"}
    seen["results"] = list(
        hpclaunch.call(in_image, sys.argv[4], options={**image, "bind": [sys.argv[4]]})
    )
elif what == "raises":
    start = time.monotonic()
    try:
        hpclaunch.call(fails_on_rank_3, options=shape)
    except ValueError as exc:
        seen["type"] = type(exc).__name__
        seen["notes"] = list(getattr(exc, "__notes__", []))
    seen["seconds"] = time.monotonic() - start
    failed = hpclaunch.get("last")
    seen["state"] = failed.state
    # From the first rank's start to the job's end: not the queue's wait before it.
    ranks = failed.record.events.first_start
    seen["ran_seconds"] = failed.record.ended_at - ranks if ranks and failed.record.ended_at else -1
elif what == "kwargs":
    one = {"cluster": cluster, "no_snapshot": True}
    seen["results"] = list(hpclaunch.call(takes_run_option_names, nodes=5, time="x", options=one))
elif what == "three":
    calls = [
        hpclaunch.submit(takes_run_option_names, nodes=i, time="t", options={**shape, "nodes": 1})
        for i in range(3)
    ]
    seen["ids"] = [c.run.id for c in calls]
    seen["results"] = [list(c.result(timeout=300)) for c in calls]
    seen["done"] = [c.done() for c in calls]
print(json.dumps(seen))
