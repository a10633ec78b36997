"""Tiny pure-Python wheels written by hand (a wheel is a zip with a .dist-info folder),
so tests can install exact versions without a network or a build backend."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _digest(data: bytes) -> str:
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def build_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """folder/<name>-<version>-py3-none-any.whl: module `name` with __version__."""
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {req}\n" for req in requires)
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{info}/METADATA": meta.encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: hpclaunch-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = "".join(f"{path},{_digest(data)},{len(data)}\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


def install_into(wheel: Path, site_packages: Path) -> None:
    """Unpack a wheel into a site-packages folder (what pip does for a pure wheel)."""
    site_packages.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site_packages)
