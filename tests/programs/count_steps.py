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
saved = os.path.join(ckpt, "rank-%d.count" % rank)
stop = []
if os.environ.get("IGNORE") == "1":
    signal.signal(getattr(signal, name), signal.SIG_IGN)
else:
    signal.signal(getattr(signal, name), lambda signum, frame: stop.append(signum))

step = 0
if os.path.exists(saved):
    with open(saved) as handle:
        step = int(handle.read())
print(
    "rank %d attempt %s resume=%s from step %d"
    % (rank, attempt, os.environ.get("HPCLAUNCH_RESUME", "0"), step),
    flush=True,
)


def save() -> None:
    with open(saved + ".tmp", "w") as handle:
        handle.write(str(step))
    os.replace(saved + ".tmp", saved)


with open(os.path.join(ckpt, "steps-%d.log" % rank), "a") as log:
    while step < STEPS:
        time.sleep(STEP_S)
        log.write("%d %s\n" % (step, attempt))
        log.flush()
        step += 1
        if stop:
            save()
            print("rank %d saved at step %d on %s" % (rank, step, name), flush=True)
            sys.exit(0)
save()
print("rank %d finished %d steps" % (rank, step), flush=True)
