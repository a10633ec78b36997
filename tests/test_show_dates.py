"""`hpclaunch show` for a person: every section labelled, times as ISO local dates
(`show --json` keeps the record's seconds since the epoch)."""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import datetime
from pathlib import Path

from builders import local_env
from test_cli import hpclaunch


def test_show_labels_every_section_and_prints_dates(tmp_path: Path) -> None:
    env = local_env(tmp_path)
    started = time.time()
    done = hpclaunch(["run", "--wait", "--", sys.executable, "-c", "pass"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    shown = hpclaunch(["show", "last"], tmp_path, env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    headers = [line for line in lines if line.startswith("==> ") and line.endswith(" <==")]
    assert lines[0] == headers[0] and headers[0].endswith("run.json (times in local time) <==")
    names = [h[4:].split(":")[0] for h in headers]
    assert names == ["record", "spec", "batch script"], headers
    for header in headers:  # a blank line before every section but the first
        at = lines.index(header)
        assert at == 0 or lines[at - 1] == "", header
    dates = dict(re.findall(r'"(submitted_at|ended_at)": "([^"]+)"', shown.stdout))
    assert set(dates) == {"submitted_at", "ended_at"}, shown.stdout
    for text in dates.values():
        when = datetime.fromisoformat(text)
        assert when.tzinfo is not None and abs(when.timestamp() - started) < 120, text
    assert not re.search(r'"\w+_at": \d', shown.stdout)  # no seconds since the epoch
    record = json.loads(hpclaunch(["show", "last", "--json"], tmp_path, env).stdout)["record"]
    assert isinstance(record["submitted_at"], float)
