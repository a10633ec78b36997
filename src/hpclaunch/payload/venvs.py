"""Python environments beside a container's framework: `hpclaunch env create`, the
check that a run's --venv belongs to its image, and the warning about ~/.local.

A venv is made INSIDE the image with --system-site-packages and a constraints file that
pins every package the image ships, so pip installs beside torch/jax and never replaces
them (node/venv_probe.py does that part, with the image's Python). Its record,
hpclaunch-venv.json, names the image it was made for.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, TextIO

from hpclaunch.config.jobspec import ContainerJob
from hpclaunch.errors import HpclaunchError, UserError, show
from hpclaunch.node import LIST_ONLY, VENV_CONSTRAINTS, VENV_PROBE, VENV_RECORD, path
from hpclaunch.payload.containers import runtime_argv
from hpclaunch.version import __version__

_CONSTRAINT = re.compile(r"The user requested \(constraint\) ([A-Za-z0-9_.\-]+)==(\S+)")
_CAUSE = re.compile(r"^\s*(\S.* depends on .*|The user requested (?!\(constraint\)).*)$")


def image_identity(image: str) -> str:
    """What a venv remembers of its image: the real path, and for a file its size and
    time (a SIF replaced in place is another image). None of a directory's contents.
    A podman-hpc image is a name in its storage: the name."""
    if not image.startswith("/"):
        return image
    real = os.path.realpath(image)
    info = os.stat(real)
    if os.path.isdir(real):
        return real
    return f"{real}|{info.st_size}|{info.st_mtime_ns}"


def read_record(venv: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads((venv / VENV_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_venv(path: str, container: Optional[ContainerJob]) -> tuple[str, list[str]]:
    """--venv (an absolute PATH) -> (PATH, warnings); refuses a venv made for another image."""
    venv = Path(path)
    if not (venv / "bin" / "python").exists() and not (venv / "bin" / "python3").exists():
        how = "--container IMAGE " if container else ""
        raise UserError(
            "--venv",
            f"{venv} is not a venv (no bin/python)",
            "",
            f"Make one: hpclaunch env create {how}PATH",
        )
    return str(venv), check_record(str(venv), read_record(venv), container)


def check_record(
    venv: str, record: Optional[dict[str, Any]], container: Optional[ContainerJob]
) -> list[str]:
    """The venv guard: warnings, or a refusal when the venv was made for another image."""
    if record is None:
        return [f"--venv {venv} has no {VENV_RECORD}: cannot check it fits the image"]
    made_for = record.get("image_id")
    wanted = image_identity(container.image) if container else None
    if made_for != wanted:
        was = record.get("image") or "no container"
        now = container.image if container else "no container"
        raise UserError(
            "--venv",
            f"{venv} was made for {was}",
            f"this run uses {now}",
            f"Run with --container {was}"
            if record.get("image")
            else "Drop --container"
            + f", or make a venv for it: hpclaunch env create --container {now} NEW_PATH",
        )
    return []


def local_paths(requirements: Path) -> list[str]:
    """Folders a requirements file points pip at (--find-links/-f, local wheels, -r/-c
    files beside it): bound into the container so pip sees them there too."""
    found: list[str] = []
    try:
        lines = requirements.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        words = line.split("#")[0].replace("=", " ", 1).split() if line.startswith("-") else []
        words = words or line.split("#")[0].split()
        for word in words[1:] if words and words[0].startswith("-") else words[:1]:
            path = Path(word).expanduser()
            path = path if path.is_absolute() else requirements.parent / path
            if path.exists():
                found.append(str(path if path.is_dir() else path.parent))
    return found


def _inside_code() -> str:
    return path(VENV_PROBE).read_text("utf-8")


def _command(container: Optional[ContainerJob], python: str, args: list[str]) -> list[str]:
    head = runtime_argv(container, clean=False) if container else []
    return [*head, python, "-I", "-c", _inside_code(), *args]


def conflict_error(output: str, image: str, field: str = "-r") -> Optional[UserError]:
    """pip's ResolutionImpossible text -> one line naming the image's package and version."""
    pins = _CONSTRAINT.findall(output)
    if not pins:
        return None
    name, version = pins[0]
    causes = [m.group(1).strip() for line in output.splitlines() if (m := _CAUSE.match(line))]
    wanted = next((c for c in causes if re.search(rf"\b{re.escape(name)}\b", c, re.I)), "")
    wanted = wanted.replace("The user requested ", "the requirements ask for ")
    what = f"{wanted}, which " if wanted else "the requirements "
    return UserError(
        field,
        f"{what}would replace the image's {name} {version}",
        f"{image} ships {name}=={version}, pinned in {VENV_CONSTRAINTS}",
        f"Ask for versions that work with {name} {version}, or use an image that has what you need",
    )


def create(
    venv: Path,
    container: Optional[ContainerJob],
    python: str,
    requirements: Optional[Path],
    out: TextIO = sys.stdout,
) -> int:
    """Make VENV inside the image (or with the site's Python) and install requirements."""
    existed = venv.exists()
    if existed and any(venv.iterdir()):
        record = read_record(venv)
        same = record is not None and record.get("image_id") == (
            image_identity(container.image) if container else None
        )
        if not same:
            raise UserError(
                "PATH",
                f"{venv} exists and is not an hpclaunch venv for this image",
                "",
                "Choose a new path, or remove it",
            )
    info = {
        "image": container.image if container else None,
        "image_id": image_identity(container.image) if container else None,
        "runtime": container.runtime if container else None,
        "hpclaunch_version": __version__,
    }
    args = [str(venv), str(requirements) if requirements else "-", json.dumps(info)]
    argv = _command(container, python, args)
    tail = _stream(argv, out)
    if tail[0] == 0:
        return 0
    if not existed and venv.exists():
        shutil.rmtree(venv, ignore_errors=True)  # nothing half-made is left behind
    image = container.image if container else "the site's Python"
    conflict = conflict_error(tail[1], image, f"-r {requirements}")
    if conflict:
        raise conflict
    raise HpclaunchError(f"making the venv failed (exit {tail[0]}); see the output above")


def _stream(argv: list[str], out: TextIO) -> tuple[int, str]:
    """Run, echo its output live, keep it for the conflict message."""
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    except OSError as exc:
        raise UserError(
            "--container-runtime",
            f"cannot start {show(argv[0])}: {exc.strerror}",
            "the runtime must be installed where `env create` runs",
            "Run it on a login node that has the runtime",
        ) from None
    kept: list[str] = []
    assert proc.stdout is not None
    for raw in proc.stdout:
        text = raw.decode("utf-8", "replace")
        out.write(text)
        out.flush()
        kept.append(text)
    return proc.wait(), "".join(kept)


def _cache_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hpclaunch" / "images"


def image_packages(
    container: ContainerJob, python: str, environ: Mapping[str, str]
) -> Optional[dict[str, str]]:
    """What the image ships {name: version}: cached per image, else asked of the image
    when its runtime is installed here (None when it cannot be known)."""
    import hashlib  # not on a held sweep's path (bench/sweep_submit.py)

    key = hashlib.sha256(image_identity(container.image).encode()).hexdigest()[:24]
    cache = _cache_dir(environ) / f"{key}.json"
    try:
        data = json.loads(cache.read_text())
        if isinstance(data, dict):
            return {str(k): str(v) for k, v in data.items()}
    except (OSError, ValueError):
        pass
    if container.runtime in ("pyxis", "ce") or not shutil.which(container.command):
        return None  # Pyxis and the CE start images only in srun
    bare = replace(container, binds=(), cwd="/")  # nothing of the host is needed
    argv = _command(bare, python, ["-", "-", json.dumps({LIST_ONLY: True})])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        packages = json.loads(done.stdout)["packages"] if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return None
    if isinstance(packages, dict):
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(packages))
        except OSError:
            pass
        return {str(k): str(v) for k, v in packages.items()}
    return None


def user_site_packages(home: Path) -> set[str]:
    """Distribution names under ~/.local/lib/python*/site-packages (normalized)."""
    names: set[str] = set()
    for meta in home.glob(".local/lib/python*/site-packages/*.*-info"):
        if meta.suffix in (".dist-info", ".egg-info"):
            names.add(re.sub(r"[-_.]+", "-", meta.name.split("-")[0]).lower())
    return names


def shadow_warning(
    container: ContainerJob, venv: str, python: str, environ: Mapping[str, str]
) -> Optional[str]:
    """A warning naming ~/.local packages the image also ships (tasks ignore them:
    PYTHONNOUSERSITE=1), or None."""
    home = Path(environ.get("HOME") or Path.home())
    mine = user_site_packages(home)
    if not mine:
        return None
    record = read_record(Path(venv)) if venv else None
    shipped = record.get("packages") if record else None
    if not isinstance(shipped, dict):
        shipped = image_packages(container, python, environ)
    if not shipped:
        return None
    both = sorted(mine & set(shipped))
    if not both:
        return None
    return (
        f"hpclaunch: warning: {home}/.local/lib/python* holds {', '.join(both)}, which the "
        "image also ships; tasks run with PYTHONNOUSERSITE=1 and ignore them "
        f"(pip uninstall --user {' '.join(both)} removes them)"
    )
