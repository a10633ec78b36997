"""Program of bench/requeue.py: the same for hpclaunch and the hand-written script.

Usage: python requeue_prog.py OUT_DIR   (OUT_DIR on a file system every node sees)

The attempt is HPCLAUNCH_ATTEMPT (hpclaunch) or SLURM_RESTART_COUNT (by hand; unset on
the first attempt). Attempt 0 waits for SIGUSR2 and, in the handler, writes
OUT_DIR/a0-r<RANK>-signal = "<t_start> <t_received> <t_exit>" and exits 0 at once.
A later attempt writes OUT_DIR/a<N>-r<RANK>-start = "<t_start>" and exits 0: the work
is done. t_start is taken before anything else runs ("first line of user code").
"""

import time

T_START = time.time()  # first statement: "user code starts" for the benchmark

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from types import FrameType  # noqa: E402
from typing import Optional  # noqa: E402


def put(path: str, text: str) -> None:
    """Write atomically: the harness never reads half a line."""
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.rename(tmp, path)


def main() -> None:
    out = sys.argv[1]
    attempt = int(os.environ.get("HPCLAUNCH_ATTEMPT") or os.environ.get("SLURM_RESTART_COUNT") or 0)
    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID", "0")
    prefix = os.path.join(out, f"a{attempt}-r{rank}")
    if attempt > 0:
        put(prefix + "-start", repr(T_START))
        return

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        t_received = time.time()
        put(prefix + "-signal", f"{T_START!r} {t_received!r} {time.time()!r}")
        os._exit(0)  # "save and exit": nothing to save here

    signal.signal(signal.SIGUSR2, on_signal)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
