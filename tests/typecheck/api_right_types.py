"""Checked by mypy in tests/test_api.py: a well-typed use of the API."""

import hpclaunch

run = hpclaunch.run(["python", "train.py"], nodes=2, tasks_per_node=4, env=["A=1"])
code: int = run.wait(timeout=10.0)
state: str = run.state
text: str = run.logs(rank=0)
again: hpclaunch.Run = hpclaunch.get("last")
listed: list[hpclaunch.Run] = hpclaunch.runs(exp="default", state="FAILED")
remote_run = hpclaunch.run("python train.py", nodes=2, remote="lumi")
remote_code: int = remote_run.wait()
