"""A resumable program for the requeue tests: each rank does STEPS steps of STEP_S
seconds, notes every step it did (and in which attempt) in the checkpoint folder, saves
its counter there when the requeue signal arrives and exits 0; a new attempt resumes
from the saved counter. IGNORE=1: the signal is ignored (the program never saves)."""

import os
import signal
import sys
import time

STEPS = int(os.environ.get("STEPS", "100"))
STEP_S = float(os.environ.get("STEP_S", "0.5"))
ckpt = os.environ["HPCLAUNCH_CHECKPOINT_DIR"]
rank = int(os.environ["RANK"])
attempt = os.environ.get("HPCLAUNCH_ATTEMPT", "?")
name = "SIG" + os.environ.get("HPCLAUNCH_REQUEUE_SIGNAL", "USR2")
saved = os.path.join(ckpt, f"rank-{rank}.count")
stop = []
if os.environ.get("IGNORE") == "1":
    signal.signal(getattr(signal, name), signal.SIG_IGN)
else:
    signal.signal(getattr(signal, name), lambda signum, frame: stop.append(signum))

step = 0
if os.path.exists(saved):
    with open(saved) as handle:
        step = int(handle.read())
resume = os.environ.get("HPCLAUNCH_RESUME", "0")
print(f"rank {rank} attempt {attempt} resume={resume} from step {step}", flush=True)


def save() -> None:
    with open(saved + ".tmp", "w") as handle:
        handle.write(str(step))
    os.replace(saved + ".tmp", saved)


with open(os.path.join(ckpt, f"steps-{rank}.log"), "a") as log:
    while step < STEPS:
        time.sleep(STEP_S)
        log.write(f"{step} {attempt}\n")
        log.flush()
        step += 1
        if stop:
            save()
            print(f"rank {rank} saved at step {step} on {name}", flush=True)
            sys.exit(0)
save()
print(f"rank {rank} finished {step} steps", flush=True)
