"""Who is submitting: the user name that run roots and checkpoint roots are made of.

Cron jobs and CI containers often set neither USER nor LOGNAME; falling back to a fixed
word would put everybody's runs into one shared folder (/scratch/<account>/user/...),
so the name comes from the password database, and from the uid when even that fails.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping


def user_name(environ: Mapping[str, str]) -> str:
    """USER, else LOGNAME, else the current uid's name, else `uid<N>`."""
    for key in ("USER", "LOGNAME"):
        if environ.get(key):
            return environ[key]
    uid = os.getuid()
    return _uid_name(uid) or f"uid{uid}"


def _uid_name(uid: int) -> str:
    """The uid's login name; '' when the container's /etc/passwd does not list it."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return ""


def with_user(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment with USER and LOGNAME set (from the uid when missing): tools in
    the job expect them (ch-run refuses to start without $USER; node-local folders are
    named after the user)."""
    env = dict(environ)
    name = user_name(environ)
    env.setdefault("USER", name)
    env.setdefault("LOGNAME", name)
    return env
