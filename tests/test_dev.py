"""hpclaunch dev's logic without the testbed (issue 36): the allocation's options, the
relay's frames and channels, the session's clock, the SSH config entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpclaunch.errors import UserError
from hpclaunch.sessions import allocation


def test_session_time_defaults_to_the_profile_dev_time(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    given = allocation.session_options({"cluster": "lumi", "nodes": "1"}, tmp_path, env)
    assert given["time"] == "2:00:00"
    given = allocation.session_options({"cluster": "lumi", "time": "0:30:00"}, tmp_path, env)
    assert given["time"] == "0:30:00"


def test_a_local_profile_is_refused_in_one_line(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    with pytest.raises(UserError) as caught:
        allocation.session_options({"cluster": "local"}, tmp_path, env)
    assert "--cluster: local runs jobs on this machine" in caught.value.render()
