"""A resumable sweep point (one rank): STEPS steps, noted one per line (with the attempt)
in $HPCLAUNCH_CHECKPOINT_DIR/steps.log; on the requeue signal it finishes the step in
hand, saves its counter and exits 0; the next attempt resumes from the counter. A resumed
attempt steps fast, so it ends before its own signal. At the end rank 0 writes
{"loss", "steps", "attempt"} to $HPCLAUNCH_RESULT_FILE: loss (X - 2) ** 2 with --x X,
else the number of steps.

Usage: resumable_point.py STEPS [--x X] [--step-s S]
STEPS may be a comma list, one entry per point (HPCLAUNCH_POINT picks)."""

import json
import os
import signal
import sys
import time

args = sys.argv[1:]
point = int(os.environ.get("HPCLAUNCH_POINT", "0"))
choices = args[0].split(",")
steps = int(choices[point] if len(choices) > 1 else choices[0])
x = float(args[args.index("--x") + 1]) if "--x" in args else None
step_s = float(args[args.index("--step-s") + 1]) if "--step-s" in args else 0.5
attempt = os.environ.get("HPCLAUNCH_ATTEMPT", "?")
if attempt not in ("0", "?"):
    step_s = 0.02
ckpt = os.environ["HPCLAUNCH_CHECKPOINT_DIR"]
name = "SIG" + os.environ.get("HPCLAUNCH_REQUEUE_SIGNAL", "USR2")
saved = os.path.join(ckpt, "count")
stop: list[int] = []
signal.signal(getattr(signal, name), lambda signum, frame: stop.append(signum))
step = 0
if os.path.exists(saved):
    with open(saved) as handle:
        step = int(handle.read())
resume = os.environ.get("HPCLAUNCH_RESUME", "0")
print(f"point {point} attempt {attempt} resume={resume} from step {step} of {steps}", flush=True)


def save() -> None:
    with open(saved + ".tmp", "w") as handle:
        handle.write(str(step))
    os.replace(saved + ".tmp", saved)


with open(os.path.join(ckpt, "steps.log"), "a") as log:
    while step < steps:
        time.sleep(step_s)
        log.write(f"{step} {attempt}\n")
        log.flush()
        step += 1
        if stop:
            save()
            print(f"point {point} saved at step {step} on {name}", flush=True)
            sys.exit(0)
save()
if os.environ.get("RANK", "0") == "0":
    loss = (x - 2.0) ** 2 if x is not None else float(steps)
    result = {"loss": loss, "steps": step, "attempt": attempt}
    with open(os.environ["HPCLAUNCH_RESULT_FILE"], "w") as handle:
        json.dump(result, handle)
print(f"point {point} finished {step} steps", flush=True)
