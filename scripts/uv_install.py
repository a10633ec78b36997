"""Install packages into this interpreter's environment with uv, from the same package
sources pip would use; exit 3 (nothing done) where uv cannot be trusted to do so.

Usage: VENV/bin/python scripts/uv_install.py PIP-INSTALL-ARGS...

Why: pip resolves, unpacks and compiles one package at a time; for torch, Lightning,
JAX and the test tools that is ~2 minutes of one CPU, the longest part of a fresh
`scripts/test.sh`. uv (https://docs.astral.sh/uv/) does the same install in parallel in
well under a minute. pip's own settings (`pip config list`: its config files and PIP_*
variables) say where packages come from on this machine (an index mirror, a folder of
wheels, a constraints file), and uv reads none of them, so each is translated to the
variable uv documents for it (https://docs.astral.sh/uv/reference/environment/). A
setting with no translation here means uv might install something else than pip would:
then this script does nothing and says why, and scripts/setup.sh runs pip.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

# pip's setting -> (uv's variable, how uv separates several values).
TRANSLATED = {
    "index-url": ("UV_INDEX_URL", " "),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", None),
    "trusted-host": ("UV_INSECURE_HOST", " "),
    "default-timeout": ("UV_HTTP_TIMEOUT", None),
    "timeout": ("UV_HTTP_TIMEOUT", None),
}
# Settings that change nothing of what gets installed.
IGNORED = {"disable-pip-version-check", "no-cache-dir", "progress-bar", "quiet", "verbose",
           "no-color", "root-user-action", "no-warn-script-location", "require-virtualenv"}
# `pip config list` prints one `SCOPE.NAME=repr(VALUE)` a line (SCOPE: global, install,
# :env:, ...).
LINE = re.compile(r"^(?P<scope>[^.]*)\.(?P<name>[a-z0-9-]+)=(?P<value>'.*'|\".*\")$")


class Untranslatable(Exception):
    """A pip setting uv has no equivalent for here."""


def pip_settings() -> dict[str, str]:
    """pip's effective settings for `install` (later scopes win, as in pip)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True, text=True, check=True,
    ).stdout
    order = {"global": 0, "install": 1, ":env:": 2}
    found: list[tuple[int, str, str]] = []
    for line in listed.splitlines():
        match = LINE.match(line.strip())
        if match is None:
            raise Untranslatable(f"a line of `pip config list` not understood: {line!r}")
        scope = match["scope"]
        if scope not in order:
            continue  # another command's settings (download, wheel, ...)
        value = ast.literal_eval(match["value"])  # pip prints repr(value)
        found.append((order[scope], match["name"], str(value)))
    return {name: value for _, name, value in sorted(found, key=lambda item: item[0])}


def uv_environment(settings: dict[str, str]) -> dict[str, str]:
    """uv's variables for pip's settings; Untranslatable for one with no equivalent."""
    env = {
        # pip takes the best version from every index; uv by default only the first
        # index that has the package (https://docs.astral.sh/uv/configuration/indexes/).
        "UV_INDEX_STRATEGY": "unsafe-best-match",
        # uv links files from its cache; across filesystems it copies and warns.
        "UV_LINK_MODE": "copy",
        # Only the sources translated here: not a uv.toml of the machine or the user's.
        "UV_NO_CONFIG": "1",
    }
    for name, value in settings.items():
        if name in IGNORED:
            continue
        if name not in TRANSLATED:
            raise Untranslatable(f"pip setting {name!r} has no uv equivalent here")
        variable, separator = TRANSLATED[name]
        values = value.split()
        env[variable] = separator.join(values) if separator else value
    return env


def uv_binary() -> Path:
    """uv from this environment, installed there by pip when missing."""
    here = Path(sys.executable).parent / "uv"
    if not here.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "uv"],
            check=True,
        )
    return here


def main(args: list[str]) -> int:
    try:
        env = uv_environment(pip_settings())
        uv = uv_binary()
    except (Untranslatable, subprocess.CalledProcessError, OSError) as exc:
        print(f"setup: not using uv ({exc}); pip installs instead", file=sys.stderr)
        return 3
    command = [str(uv), "pip", "install", "--quiet", "--python", sys.executable,
               "--compile-bytecode", *args]
    done = subprocess.run(command, env={**os.environ, **env})
    if done.returncode != 0:
        print(f"setup: uv exited {done.returncode}; pip installs instead", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
