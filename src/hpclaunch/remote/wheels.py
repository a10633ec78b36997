"""The wheels `remote setup` ships: this very hpclaunch, packed from its installed files
(so the cluster runs byte for byte what the laptop runs, an editable checkout included),
and its dependencies for the cluster's Python, fetched here by pip (login nodes may have
no package index). They are cached per target under ~/.cache/hpclaunch/wheels.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpclaunch.errors import UserError
from hpclaunch.remote.build_id import PACKAGE, fingerprint, package_files

DIST = "hpclaunch"


def _digest(data: bytes) -> str:
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def own_wheel(folder: Path) -> Path:
    """folder/hpclaunch-<version>+<build>-py3-none-any.whl, from the installed files.
    The local version label carries the build id, so pip never takes it for another."""
    dist = importlib.metadata.distribution(DIST)
    build = fingerprint()
    version = f"{dist.version}+b{build}"
    info = f"{DIST}-{version}.dist-info"
    meta = dist.read_text("METADATA") or f"Metadata-Version: 2.1\nName: {DIST}\n"
    meta = "\n".join(
        f"Version: {version}" if line.startswith("Version:") else line for line in meta.splitlines()
    )
    files: dict[str, bytes] = {
        f"{DIST}/{rel}": (PACKAGE / rel).read_bytes() for rel in package_files()
    }
    files[f"{info}/METADATA"] = (meta + "\n").encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: hpclaunch remote setup\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n"
    )
    files[f"{info}/entry_points.txt"] = (dist.read_text("entry_points.txt") or "").encode()
    record = "".join(f"{path},{_digest(data)},{len(data)}\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = folder / f"{DIST}-{version}-py3-none-any.whl"
    for old in folder.glob(f"{DIST}-*.whl"):
        old.unlink()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in sorted(files.items()):
            archive.writestr(zipfile.ZipInfo(member, (2020, 1, 1, 0, 0, 0)), data)
    return path


def extras() -> list[str]:
    """The optional extras this hpclaunch offers (stack, plot, optuna, yaml, ...)."""
    meta = importlib.metadata.distribution(DIST).metadata
    return [name for name in meta.get_all("Provides-Extra") or [] if name not in HIDDEN]


HIDDEN = ("test", "bench")  # the project's own, never wanted on a cluster


def requirements(wanted: Sequence[str] = ()) -> list[str]:
    """hpclaunch's own dependencies, and those of the `wanted` extras (their marker
    dropped: pip judges the rest)."""
    found = importlib.metadata.distribution(DIST).requires or []
    out: list[str] = []
    for req in found:
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        if extra is None:
            out.append(req)
        elif extra.group(1) in wanted:
            out.append(req.split(";", 1)[0].strip())
    return out


def dependencies(folder: Path, target: Mapping[str, str], wanted: Sequence[str] = ()) -> None:
    """pip download the dependencies' wheels for the target's Python and machine.
    target: `version` ("3.11"), `machine` ("x86_64"), `glibc` ("2.36" or "")."""
    major, minor = target["version"].split(".")[:2]
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        "--dest",
        str(folder),
        "--python-version",
        f"{major}.{minor}",
        "--implementation",
        "cp",
        "--abi",
        f"cp{major}{minor}",
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for platform in _platforms(target["machine"], target.get("glibc", "")):
        argv += ["--platform", platform]
    done = subprocess.run(
        [*argv, *requirements(wanted)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise UserError(
            "remote setup",
            f"pip could not fetch hpclaunch's dependencies for Python {major}.{minor} "
            f"on {target['machine']} ({said})",
            "",
            "Check this machine's access to the package index",
        )


def _platforms(machine: str, glibc: str) -> list[str]:
    """manylinux tags the target can load (pip widens each to the older ones)."""
    out = [f"linux_{machine}", f"manylinux2014_{machine}"]
    if glibc:
        out.append(f"manylinux_{glibc.replace('.', '_')}_{machine}")
    return out
