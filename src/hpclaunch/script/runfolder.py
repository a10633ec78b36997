"""What a run folder holds before its job starts, written once for runs and sweeps:
the job script, the shipped files (the bootstrap's bytecode made here), py-spy where a
rank is profiled, spec.json and stage.json. run.json is records/runrecord.py's (`new_record`,
`write_new`): every writer of a run's folder (launching.py, sweeps/folder.py) calls
these, so a run and a sweep point hold the same files.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Optional

from hpclaunch import node
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.records import runrecord
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import badnodes, broadcast, lostnodes, profiling, render, venvmount

SPEC_JSON = "spec.json"


def write_files(
    paths: RunPaths,
    spec: JobSpec,
    script: str,
    *,
    stage_json: bool = True,
    files: tuple[tuple[str, str], ...] = (),
) -> None:
    """job.sh (the batch script or a sweep's array script), the shipped files (one copy
    in a sweep folder for all its points), py-spy, spec.json; stage.json with staging
    unless `stage_json` is False (a sweep's points have their own); the plan's `files`
    (the CE's EDF) beside the shipped ones."""
    # Arguments may hold any bytes (surrogate-escaped in Python): write them back as bytes.
    paths.job_sh.write_bytes(script.encode("utf-8", "surrogateescape"))
    staging = bool(spec.stage or spec.stage_out)
    if staging and stage_json:
        runrecord.write_json(paths.run_dir / node.STAGE_JSON, render.stage_json(spec, paths))
    mounts = venvmount.mounts_on_nodes(spec)
    sends = broadcast.broadcasts(spec)
    # --preflight/--spares, --requeue/--chain (lostnodes.py): preflight.py beside the bootstrap
    placing = badnodes.placing(spec) or lostnodes.wanted(spec)
    watching = bool(spec.watch_interval_s)
    for source in node.shipped(staging, watching, mounts, sends, placing=placing):
        shutil.copyfile(node.path(source), paths.shipped(source))
    precompile(paths.shipped(node.BOOTSTRAP), node.path(node.BOOTSTRAP))
    profiling.ship(spec, paths)  # py-spy beside the bootstrap, where every rank looks
    for name, text in files:
        ((paths.shipped_dir or paths.run_dir) / name).write_text(text)
    runrecord.write_json(paths.run_dir / SPEC_JSON, spec.to_record())


def precompile(module: Path, origin: Optional[Path] = None) -> None:
    """The bootstrap's bytecode, made once here: ranks whose Python is this one load it
    instead of compiling (others compile once, on the first rank). `origin`: the file
    `module` was copied from; its own cached bytecode, when fresh, is copied with the
    copy's timestamp instead of compiling 1,200 lines again (a fifth of a held sweep's
    writing; the header is PEP 552's timestamp form, https://peps.python.org/pep-0552/)."""
    if origin is not None and _copy_cached(origin, module):
        return
    import py_compile

    with contextlib.suppress(py_compile.PyCompileError, OSError):  # else ranks compile it
        py_compile.compile(str(module), doraise=True)


def _copy_cached(origin: Path, module: Path) -> bool:
    """origin's cached bytecode as module's, when it matches origin as it is (magic
    number, a timestamp pyc with origin's mtime and size); False when it does not."""
    from importlib.util import MAGIC_NUMBER, cache_from_source

    try:
        with open(cache_from_source(str(origin)), "rb") as fh:
            data = fh.read()
        have = os.stat(origin)
        if data[:8] != MAGIC_NUMBER + b"\0\0\0\0" or data[8:16] != _stamp(have):
            return False
        target = Path(cache_from_source(str(module)))
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(data[:8] + _stamp(os.stat(module)) + data[16:])
    except OSError:
        return False
    return True


def _stamp(info: os.stat_result) -> bytes:
    """A timestamp pyc's source mtime and size, as importlib checks them."""
    mask = 0xFFFFFFFF
    return (int(info.st_mtime) & mask).to_bytes(4, "little") + (info.st_size & mask).to_bytes(
        4, "little"
    )


__all__ = ["SPEC_JSON", "precompile", "write_files"]
