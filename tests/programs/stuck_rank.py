"""Ranks that block for `hpclaunch stack` (tests/test_e2e_stack.py): rank 1 in
`stuck_here`, every other rank in `waiting_for_data`. Each prints `ready RANK WHERE`
from inside its function (WHERE: `image` when the testbed image's marker file is there,
else `host`), then sleeps SECONDS (argv[1], default 120) and exits 0."""

import os
import sys
import time


def ready() -> None:
    where = "image" if os.path.exists("/hpclaunch-test-image") else "host"
    print("ready", os.environ["RANK"], where, flush=True)


def stuck_here(seconds: float) -> None:
    ready()
    time.sleep(seconds)


def waiting_for_data(seconds: float) -> None:
    ready()
    time.sleep(seconds)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
    if os.environ.get("RANK") == "1":
        stuck_here(seconds)
    else:
        waiting_for_data(seconds)


if __name__ == "__main__":
    main()
