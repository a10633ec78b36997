"""Checked by mypy in tests/test_api.py: each call below is a type error."""

import hpclaunch

hpclaunch.run(["python", "train.py"], nodes="2")
hpclaunch.run(["python", "train.py"], env="WANDB_MODE=offline")
hpclaunch.run(["python", "train.py"], launcher="mpirun")
hpclaunch.run(["python", "train.py"], node=2)
