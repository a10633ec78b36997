"""The ten slowest tests of a whole scripts/test.sh run, from its phases' JUnit XML files.

scripts/test.sh runs pytest twice (the side-by-side phase, then the serial one), so each
pytest's own --durations list covers only its phase; this reads both phases' reports
(pytest --junitxml) and prints one list for the run, each test's set-up + call +
tear-down time, as pytest's --durations would for the whole.

    python scripts/slowest.py [-n COUNT] [--durations-out tests/durations.json] REPORT.xml...
    python scripts/slowest.py --at-least SECONDS REPORT.xml...   (every test that long)

--durations-out writes every test of at least 2 s and its time (JSON, sorted), the table
tests/conftest.py orders the side-by-side phase by: longest first, so the tests that wait
minutes on Slurm start at once beside the unit tests instead of ending the run alone.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path


def test_times(reports: list[Path]) -> list[tuple[float, str]]:
    """(seconds, "file::name") of every test case in the reports that exist."""
    found = []
    for report in reports:
        if not report.is_file():
            continue  # a phase that did not run (interrupted, or nothing selected)
        for case in ET.parse(report).iter("testcase"):
            module = case.get("classname", "").replace(".", "/")
            found.append((float(case.get("time") or 0), f"{module}.py::{case.get('name')}"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10, help="how many (default 10)")
    parser.add_argument(
        "--at-least", type=float, help="instead: every test of at least this many seconds"
    )
    parser.add_argument("--durations-out", type=Path, help="write tests of >= 2 s as JSON")
    parser.add_argument("reports", nargs="+", type=Path)
    args = parser.parse_args()
    times = sorted(test_times(args.reports), reverse=True)
    if args.durations_out:
        slow = {name: round(seconds, 1) for seconds, name in times if seconds >= 2}
        args.durations_out.write_text(json.dumps(dict(sorted(slow.items())), indent=0) + "\n")
    total = sum(seconds for seconds, _ in times)
    if args.at_least is not None:
        long = [(seconds, name) for seconds, name in times if seconds >= args.at_least]
        print(f"===== {len(long)} tests of at least {args.at_least:g} s =====")
        for seconds, name in long:
            print(f"{seconds:8.2f}s {name}")
        return
    print(
        f"===== {args.n} slowest tests of the whole run ({len(times)} tests, {total:.0f} s) ====="
    )
    for seconds, name in times[: args.n]:
        print(f"{seconds:8.2f}s {name}")


if __name__ == "__main__":
    main()
