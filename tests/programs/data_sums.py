"""Checksums of every file under $HPCLAUNCH_DATA_DATASET, as one rank sees them, plus
where that copy lives. Usage: data_sums.py OUT_DIR (writes OUT_DIR/sums-<rank>.json)."""

from __future__ import annotations

import hashlib
import json
import os
import sys


def main() -> None:
    root = os.environ["HPCLAUNCH_DATA_DATASET"]
    sums = {}
    for top, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(top, name)
            with open(path, "rb") as handle:
                sums[os.path.relpath(path, root)] = hashlib.sha256(handle.read()).hexdigest()
    with open("/proc/self/mounts") as handle:
        tmp = [line.split() for line in handle if line.split()[1] == "/tmp"]
    report = {
        "rank": os.environ["RANK"],
        "node": os.environ.get("SLURMD_NODENAME", ""),
        "root": root,
        "local": os.environ["HPCLAUNCH_LOCAL"],
        "data": os.environ.get("HPCLAUNCH_DATA"),
        "tmp_fs": tmp[-1][2] if tmp else "",
        "sums": sums,
    }
    with open(os.path.join(sys.argv[1], f"sums-{os.environ['RANK']}.json"), "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    main()
