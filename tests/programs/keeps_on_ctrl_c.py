"""A rank that notes each Ctrl-C (SIGINT) on stderr and goes on, as a program that saves
its state slowly would (tests/test_e2e_step_signals.py): `ready RANK` on stderr, then
SECONDS (argv[1], default 120) of sleep, exit 0."""

import os
import signal
import sys
import time


def _noted(signum: int, frame: object) -> None:
    print("got SIGINT", os.environ.get("RANK"), file=sys.stderr, flush=True)


signal.signal(signal.SIGINT, _noted)
print("ready", os.environ.get("RANK"), file=sys.stderr, flush=True)
end = time.monotonic() + (float(sys.argv[1]) if len(sys.argv) > 1 else 120.0)
while time.monotonic() < end:
    time.sleep(0.1)
