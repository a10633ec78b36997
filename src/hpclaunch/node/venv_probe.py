"""Runs INSIDE the container (or with the site's Python) for `hpclaunch env create`.

Standard library only, Python >= 3.8, never an import of hpclaunch: it is handed to the
image's own Python with -c (the rules: hpclaunch/node/__init__.py, which also holds the
host's definition of the constants below marked "shared").
Lists what the image ships, makes the venv with --system-site-packages (with the base
interpreter when the Python it runs with is a venv's, and says which), writes pins of
every package that interpreter has as a pip constraints file, installs the requirements
against those pins and writes the venv's record. Usage:

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


# The listing above as a program, for another interpreter (the base of a venv).
LIST_CODE = (
    "import json, re, sys\n"
    "from importlib import metadata\n"
    "found = {}\n"
    "for dist in metadata.distributions():\n"
    "    name = dist.metadata['Name']\n"
    "    if name:\n"
    "        found.setdefault(re.sub(r'[-_.]+', '-', name).lower(), dist.version)\n"
    "sys.stdout.write(json.dumps(found))\n"
)


def base_interpreter() -> str:
    """The interpreter a new venv is made with: this one, or when this one is itself a
    venv's (`python3` of an activated venv), that venv's base: a venv made from a venv
    sees its base's packages (--system-site-packages), never the outer venv's."""
    here = sys.executable or os.path.realpath("/proc/self/exe")
    if sys.prefix == getattr(sys, "base_prefix", sys.prefix):
        return here
    try:
        with open(os.path.join(sys.prefix, "pyvenv.cfg")) as handle:
            cfg = dict(line.split("=", 1) for line in handle if "=" in line)
    except OSError:
        cfg = {}
    home = cfg.get("home", "").strip()
    for name in ("python%d.%d" % sys.version_info[:2], "python3", "python"):
        if home and os.path.isfile(os.path.join(home, name)):
            return os.path.join(home, name)
    return os.path.realpath(here)


def base_packages(base: str) -> dict[str, str]:
    """What `base` has, {name: version}: the packages the new venv sees."""
    if base == (sys.executable or base):
        return shipped_packages()
    out = subprocess.check_output([base, "-I", "-c", LIST_CODE])
    return {str(k): str(v) for k, v in json.loads(out.decode("utf-8")).items()}


def base_version(base: str) -> str:
    if base == sys.executable:
        return platform.python_version()
    code = "import platform; print(platform.python_version())"
    return subprocess.check_output([base, "-I", "-c", code]).decode("utf-8").strip()


def main(argv: list[str]) -> int:
    venv, requirements, info = argv[1], argv[2], json.loads(argv[3])
    # The host's environment came along (pip's proxies, index, HOME); its Python
    # settings belong to the host's Python, not the image's.
    for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "VIRTUAL_ENV", "PIP_USER"):
        os.environ.pop(name, None)
    os.environ["PYTHONNOUSERSITE"] = "1"
    os.environ.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if info.get(LIST_ONLY):
        packages = shipped_packages()
        sys.stdout.write(json.dumps({"python": platform.python_version(), "packages": packages}))
        return 0
    base = base_interpreter()
    packages = base_packages(base)  # pinned: exactly what the new venv sees, no more
    version = base_version(base)
    said = "hpclaunch: making the venv with %s (Python %s)" % (base, version)
    if base != sys.executable:
        said += "; %s is the venv %s, whose own packages a new venv cannot see: not pinned" % (
            sys.executable,
            sys.prefix,
        )
    sys.stdout.write(said + "\n")
    sys.stdout.flush()
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
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
        interpreter=base,
        python=version,
        packages=packages,
        created_at=time.time(),
    )
    with open(os.path.join(venv, VENV_RECORD), "w") as handle:
        json.dump(record, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
