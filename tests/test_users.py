"""users.user_name(): USER, else LOGNAME, else the uid's name, else uid<N>."""

from __future__ import annotations

import os
import pwd

import pytest

from hpclaunch.basics import users


def test_user_wins() -> None:
    assert users.user_name({"USER": "alice", "LOGNAME": "bob"}) == "alice"


def test_logname_when_user_is_missing_or_empty() -> None:
    assert users.user_name({"LOGNAME": "bob"}) == "bob"
    assert users.user_name({"USER": "", "LOGNAME": "bob"}) == "bob"


def test_neither_set_gives_the_current_uids_name() -> None:
    assert users.user_name({}) == pwd.getpwuid(os.getuid()).pw_name


def test_uid_without_a_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", missing)
    monkeypatch.setattr(os, "getuid", lambda: 4242)
    assert users.user_name({"PATH": "/bin"}) == "uid4242"
