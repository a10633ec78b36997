"""Packed vs plain venv: `import numpy` time and the file-system calls on the venv's files.

Two identical venvs (this Python's `venv`, numpy copied in: ~1,600 files) in one folder:
`plain` used as is, `packed` packed by `hpclaunch env pack` and mounted at its original
path by node/venv_mount.py (squashfuse, as root, as a job's node would). Per rep and
method, cold (page cache dropped, as root) and warm, one `python -c "import numpy"` with
the venv's Python, timed; then once under `strace -f` to count the calls that reach the
venv's file system: for `plain` the Python's calls naming a path under the venv, for
`packed` squashfuse's calls on the .sqsh file (the Python's own go to the FUSE mount,
which is the node's memory, not the shared file system). Here the venvs lie on a local
disk: the times are this disk's; the counts are what a shared file system (Lustre, NFS)
would serve, one metadata round trip or more each, from every node.

    sudo .venv/bin/python bench/venvpack.py --reps 5

Options (bench/harness.py's): --reps, --quick, --no-doc, --doc, --render-only.
Environment: BENCH_DIR (default /var/tmp/hpclaunch-bench/venvpack).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness as h

from hpclaunch.node import VENV_MOUNT
from hpclaunch.node import path as node_path
from hpclaunch.payload import venvpack

SCRATCH = Path(os.environ.get("BENCH_DIR", "/var/tmp/hpclaunch-bench/venvpack"))
SAVED = SCRATCH / "results.json"
IMPORT = "import numpy"


def make_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    import numpy

    site = next(path.glob("lib/python*/site-packages"))
    source = Path(numpy.__file__).parent
    for name in [source.name, *(p.name for p in source.parent.glob("numpy.libs"))]:
        shutil.copytree(source.parent / name, site / name, symlinks=True)
    return path


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def import_s(venv: Path, cold: bool) -> float:
    if cold:
        drop_caches()
    took, done = h.run_timed([str(venv / "bin" / "python"), "-c", IMPORT])
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-300:])
    return took


def count_calls(trace: Path, needle: str) -> int:
    return sum(needle in line for line in trace.read_text(errors="replace").splitlines())


def traced_plain(venv: Path) -> int:
    trace = SCRATCH / "plain.strace"
    argv = [str(venv / "bin" / "python"), "-c", IMPORT]
    subprocess.run(["strace", "-f", "-qq", "-o", str(trace), *argv], check=True)
    return count_calls(trace, str(venv) + "/") + count_calls(trace, f'"{venv}"')


def mount(image: Path, venv: Path, traced: bool) -> subprocess.Popen[bytes]:
    """The node's mount; traced: squashfuse itself run under strace (its reads counted)."""
    marks = SCRATCH / "marks"
    shutil.rmtree(marks, ignore_errors=True)
    argv = [sys.executable, "-I", "-S", str(node_path(VENV_MOUNT)), str(image), str(venv)]
    env = dict(os.environ)
    if traced:
        wrapper = SCRATCH / "bin"
        wrapper.mkdir(exist_ok=True)
        real = shutil.which("squashfuse")
        trace = SCRATCH / "packed.strace"
        (wrapper / "squashfuse").write_text(
            f'#!/bin/sh\nexec strace -f -qq -y -o {trace} -e trace=%file,read,pread64 {real} "$@"\n'
        )
        (wrapper / "squashfuse").chmod(0o755)
        env["PATH"] = f"{wrapper}:{env['PATH']}"
    proc = subprocess.Popen([*argv, str(marks)], env=env)
    for _ in range(400):
        if any(marks.glob("ready-*")):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError("the packed venv did not mount")


def unmount(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGUSR1)
    proc.wait(timeout=60)


def measure(reps: int) -> dict[str, Any]:
    h.fresh(SCRATCH)
    plain = make_venv(SCRATCH / "plain")
    packed = make_venv(SCRATCH / "packed")
    image = venvpack.pack(packed, None)
    files = sum(len(f) for _, _, f in os.walk(packed))
    shutil.rmtree(packed)  # only the image is left: its mount point is made by the mount
    data: dict[str, Any] = {"reps": reps, "facts": h.machine_facts(slurm=False), "files": files}
    data["image_mb"] = image.stat().st_size / 2**20
    proc = mount(image, packed, traced=False)
    try:
        methods = {
            f"{name} {temp}": (lambda _rep, v=venv, c=temp == "cold": import_s(v, c))
            for name, venv in (("plain", plain), ("packed", packed))
            for temp in ("cold", "warm")
        }
        got = h.interleave(methods, reps, order=h.ALTERNATE, progress=h.print_metrics)
    finally:
        unmount(proc)
    data["times"] = got.kept
    data["errors"] = got.errors
    data["plain_calls"] = traced_plain(plain)
    drop_caches()
    proc = mount(image, packed, traced=True)
    try:
        import_s(packed, cold=False)  # cold for squashfuse: the page cache was just dropped
    finally:
        unmount(proc)
    # Path calls (open, stat: the metadata servers' work) apart from the reads of the one
    # file squashfuse keeps open (the data servers', in 128 KiB blocks).
    text = (SCRATCH / "packed.strace").read_text(errors="replace").splitlines()
    on_image = [line for line in text if str(image) in line]
    reads = [line for line in on_image if re.match(r"^(\d+ +)?p?read", line)]
    data["packed_calls"] = len(on_image) - len(reads)
    data["packed_reads"] = len(reads)
    return data


def render(data: dict[str, Any]) -> list[str]:
    times = data["times"]
    reads = {"plain": "(in the calls)", "packed": str(data.get("packed_reads", "?"))}
    rows = [
        [
            name,
            h.fmt(times[f"{name} cold"]),
            h.fmt(times[f"{name} warm"]),
            str(data[f"{name}_calls"]),
            reads[name],
            str(len(times[f"{name} cold"])),
        ]
        for name in ("plain", "packed")
    ]
    head = ["venv", "import numpy, cold", "warm", "path calls (open, stat)", "block reads", "n"]
    fewer = data["packed_calls"] * 10 <= data["plain_calls"]
    verdicts = [
        h.verdict(
            fewer,
            f"packed: {data['packed_calls']} path calls on the shared file system against "
            f"{data['plain_calls']} for the plain venv (at most a tenth)",
        )
    ]
    verdicts += [f"{m} failed: {e}" for m, errors in data["errors"].items() for e in errors]
    return [*h.table(head, rows), "", *[f"- {v}" for v in verdicts]]


def doc_section(body: list[str], data: dict[str, Any]) -> str:
    return h.section(
        "venvpack",
        "Scale: environments and data (`bench/venvpack.py`)",
        [
            f"Measured {data['facts']['date']}; {h.facts_line(data['facts'])}. A venv with "
            f"numpy ({data['files']} files; packed: {data['image_mb']:.1f} MiB), plain and "
            "packed (`hpclaunch env pack`, mounted at its original path by "
            "node/venv_mount.py with squashfuse); median (min-max) over n reps of `python -c "
            "'import numpy'`, cold (page cache dropped) and warm. Calls, under `strace -f`: "
            "the Python's calls naming a path of the plain venv (each a metadata round trip "
            "on Lustre or NFS); for the packed venv, squashfuse's calls naming the .sqsh "
            "file, and apart its block reads of that one open file (the Python's calls go to "
            "the FUSE mount, in the node's memory). The "
            "venvs lie on a local disk here, so the times are this disk's; on a shared file "
            "system every one of the plain venv's calls is a round trip to its servers, from "
            "every rank of every node (issue 33 quotes OLCF's Python guide: 8 Frontier nodes "
            "loaded an environment in 3 min 56 s from NFS, 51 s from Lustre, 2 s once "
            "broadcast to node-local storage).",
            "",
            *body,
            "",
            *h.reproduce(f"sudo .venv/bin/python bench/venvpack.py --reps {data['reps']}"),
        ],
    )


def main() -> int:
    parser = h.arguments(__doc__.splitlines()[0], reps=5, quick_reps=1)
    args = h.parse(parser)
    data = h.results(args, SAVED, lambda: measure(args.reps))
    h.publish(args, "venvpack", doc_section(render(data), data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
