"""Runs INSIDE the container (or with the site's Python) for `hpclaunch env create`.

Standard library only, Python >= 3.8, never an import of hpclaunch: it is handed to the
image's own Python with -c (the rules: hpclaunch/node/__init__.py, which also holds the
host's definition of the constants below marked "shared").
Lists what the image ships, makes the venv with --system-site-packages, writes pins of
every shipped package as a pip constraints file, installs the requirements against those
pins and writes the venv's record. Usage:

    python3 -I -c "$(cat venv_probe.py)" VENV REQUIREMENTS|- INFO_JSON

Exit codes: pip's when it fails, 3 when the venv cannot be made, 0 on success.
"""

from __future__ import annotations  # annotations stay strings (Python 3.8 runs this)

import json
import os
import platform
import re
import subprocess
import sys
import time

# Shared with the host side (hpclaunch/node/__init__.py has the same values; a test
# compares them): this text runs alone, so it cannot import them.
VENV_RECORD = "hpclaunch-venv.json"
VENV_CONSTRAINTS = "hpclaunch-constraints.txt"
LIST_ONLY = "list_only"
# pip manages itself inside the venv (ensurepip); pinning it would block `pip install -U pip`.
UNPINNED = {"pip"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def shipped_packages() -> dict[str, str]:
    from importlib import metadata

    found: dict[str, str] = {}
    for dist in metadata.distributions():  # sys.path order: the first one is the one imported
        name = dist.metadata["Name"]
        if name:
            found.setdefault(normalize(name), dist.version)
    return found


def main(argv: list[str]) -> int:
    venv, requirements, info = argv[1], argv[2], json.loads(argv[3])
    # The host's environment came along (pip's proxies, index, HOME); its Python
    # settings belong to the host's Python, not the image's.
    for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "VIRTUAL_ENV", "PIP_USER"):
        os.environ.pop(name, None)
    os.environ["PYTHONNOUSERSITE"] = "1"
    os.environ.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    packages = shipped_packages()
    if info.get(LIST_ONLY):
        sys.stdout.write(json.dumps({"python": platform.python_version(), "packages": packages}))
        return 0
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        base = sys.executable or os.path.realpath("/proc/self/exe")
        made = subprocess.call([base, "-m", "venv", "--system-site-packages", venv])
        if made != 0:
            sys.stderr.write("hpclaunch: python -m venv failed in the image (exit %d)\n" % made)
            return 3
    with open(os.path.join(venv, VENV_CONSTRAINTS), "w") as handle:
        handle.write("# Pins of what the image ships: pip may add packages, never replace these.\n")
        for name in sorted(packages):
            if name not in UNPINNED:
                handle.write("%s==%s\n" % (name, packages[name]))
    if requirements != "-":
        command = [python, "-m", "pip", "install", "--disable-pip-version-check"]
        command += ["-c", os.path.join(venv, VENV_CONSTRAINTS), "-r", requirements]
        returncode = subprocess.call(command)
        if returncode != 0:
            return returncode
    record = dict(info)
    record.update(
        python=platform.python_version(),
        packages=packages,
        created_at=time.time(),
    )
    with open(os.path.join(venv, VENV_RECORD), "w") as handle:
        json.dump(record, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
