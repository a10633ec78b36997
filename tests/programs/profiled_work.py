"""A program to profile: spends SECONDS (argv[1], default 3) in `profiled_hot_loop`, a
name a profile must show, prints its rank and HPCLAUNCH_PROFILE, and where it runs
(`image` when the testbed image's marker file is there, else `host`), and exits with
argv[2] (default 0). Standard library only: it also runs inside the test image."""

import os
import sys
import time


def profiled_hot_loop(seconds: float) -> int:
    total = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        total += sum(range(2000))
    return total


where = "image" if os.path.exists("/hpclaunch-test-image") else "host"
print("rank", os.environ.get("RANK"), "profile", os.environ.get("HPCLAUNCH_PROFILE"), flush=True)
print(where, flush=True)
profiled_hot_loop(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
