"""Broadcast staging on the Slurm testbed: bytes read from the shared copy and staging
time against node count, sbcast against the per-node read (a harness, not a test).

A 64 MiB archive (random bytes: nothing compresses) is staged with `hpclaunch run -N n
--stage ARCHIVE -- true` on 1 and 2 nodes, with broadcast (sbcast, the default on more
than one node) and without (an `sbcast` on PATH that refuses, as a site without it).
Every process that reads the shared copy (`tar` on each node, `sbcast`) runs under
`strace -f -y -e trace=read,pread64` through a wrapper on the job's PATH; the bytes its
reads of the archive returned are summed. Time: the whole `run --wait` (submission to
the end, the same overhead for every method) and the slowest node's unpack (its
guard's <run_dir>/stage/ready-<node>). On 1,000 nodes the per-node read is 1,000 copies
from the shared file system, the broadcast one (Slurm fans it out over its daemons'
tree, https://slurm.schedmd.com/sbcast.html).

    sudo .venv/bin/python bench/broadcast.py --reps 3

Options (bench/harness.py's): --reps, --quick, --no-doc, --doc, --render-only.
Environment: TESTBED_STATE (default /var/tmp/hpclaunch-testbed).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import harness as h

STATE = Path(os.environ.get("TESTBED_STATE", "/var/tmp/hpclaunch-testbed"))
WORK = STATE / "work" / "bench-broadcast"
SAVED = WORK / "results.json"
USER = "hpcuser"
USER_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
SIZE = 64 * 2**20
READ = re.compile(r"^(?:\d+ +)?p?read(?:64)?\(\d+<([^>]*)>, .*\) = (\d+)$")
# sbcast maps the whole file and sends it: the mapped length is what it reads.
MMAP = re.compile(r"^(?:\d+ +)?mmap\([^,]+, (\d+), [^,]+, [^,]+, \d+<([^>]*)>, ")
REFUSE = "#!/bin/sh\necho 'sbcast: error: refused (bench)' >&2\nexit 1\n"


def wrappers(folder: Path, traces: Path, refuse: bool) -> None:
    folder.mkdir(parents=True)
    for tool in ("tar", "sbcast"):
        real = shutil.which(tool, path=USER_PATH)
        text = (
            f'#!/bin/sh\nexec strace -f -qq -y -e trace=read,pread64,mmap -o "{traces}/{tool}.'
            f'$(hostname).$$" {real} "$@"\n'
        )
        (folder / tool).write_text(REFUSE if refuse and tool == "sbcast" else text)
        (folder / tool).chmod(0o755)


def bytes_read(traces: Path, shared: Path) -> int:
    total = 0
    for trace in traces.iterdir():
        for line in trace.read_text(errors="replace").splitlines():
            match = READ.match(line)
            if match and match.group(1) == str(shared):
                total += int(match.group(2))
            mapped = MMAP.match(line)
            if mapped and mapped.group(2) == str(shared):
                total += int(mapped.group(1))
    return total


def stage_once(nodes: int, refuse: bool, rep: int) -> dict[str, float]:
    tag = f"{nodes}-{'pernode' if refuse else 'bcast'}-{rep}"
    base = WORK / tag
    traces, bin_dir = base / "traces", base / "bin"
    traces.mkdir(parents=True)
    wrappers(bin_dir, traces, refuse)
    subprocess.run(["chown", "-R", USER, str(base)], check=True)
    env = {
        "HOME": pwd.getpwnam(USER).pw_dir, "USER": USER, "LOGNAME": USER, "LANG": "C.UTF-8",
        "PATH": f"{bin_dir}:{h.REPO / '.venv' / 'bin'}:{USER_PATH}",
        "SLURM_CONF": str(STATE / "slurm.conf"), "XDG_DATA_HOME": str(base / "xdg"),
        "XDG_CONFIG_HOME": str(base / "xdg"), "HPCLAUNCH_CLUSTER": "slurm",
    }  # fmt: skip
    argv = ["hpclaunch", "run", "-N", str(nodes), "--wait", "--run-root", str(base / "runs"),
            "--stage", str(WORK / "data.tar"), "--", "true"]  # fmt: skip
    cmd = ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
    took, done = h.run_timed(cmd, cwd=WORK, timeout=600)
    if done.returncode != 0:
        raise RuntimeError((done.stdout + done.stderr)[-800:])
    ready = [float(p.read_text()) for p in (base / "runs").glob("*/*/stage/ready-*")]
    return {
        "s": took,
        "unpack_s": max(ready) if ready else h.NAN,
        "mib": bytes_read(traces, WORK / "data.tar") / 2**20,
    }


IMAGES = STATE / "images"
IMAGE_CWD = WORK / "image-runs"  # the image has this folder: ch-run binds it


def make_image() -> Path:
    """The testbed's Python image as a SquashFS file with IMAGE_CWD in it (ch-run cannot
    make a mount point in a read-only image)."""
    IMAGE_CWD.mkdir(parents=True)
    parts = IMAGE_CWD.relative_to("/").parts
    made = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    pseudo = [f"{d} d 755 0 0" for d in made if not (IMAGES / "debian-python" / d).exists()]
    image = WORK / "image.sqfs"
    subprocess.run(
        ["mksquashfs", str(IMAGES / "debian-python"), str(image), "-noappend", "-no-progress",
         "-quiet", "-comp", "lz4", *(a for p in pseudo for a in ("-p", p))],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # 2 nodes: below the profile's default image_broadcast_min_nodes (8), which these
    # rows measure the reason for; the project file of the runs' folder lowers it.
    (IMAGE_CWD / "hpclaunch.toml").write_text("[clusters.slurm]\nimage_broadcast_min_nodes = 2\n")
    return image


def image_once(refuse: bool, rep: int) -> dict[str, float]:
    """2 nodes run `true` in the Charliecloud image file, as root (ch-run mounts it
    through FUSE; the testbed's /dev/fuse is root's): sbcast and ch-run traced."""
    tag = f"image-{'pernode' if refuse else 'bcast'}-{rep}"
    traces, bin_dir = WORK / tag / "traces", WORK / tag / "bin"
    traces.mkdir(parents=True)
    bin_dir.mkdir(parents=True)
    for tool in ("ch-run", "sbcast"):
        real = shutil.which(tool, path=USER_PATH)
        text = (
            f'#!/bin/sh\nexec strace -f -qq -y -e trace=read,pread64,mmap -o "{traces}/{tool}.'
            f'$(hostname).$$" {real} "$@"\n'
        )
        (bin_dir / tool).write_text(REFUSE if refuse and tool == "sbcast" else text)
        (bin_dir / tool).chmod(0o755)
    env = {
        "HOME": "/root", "USER": "root", "LOGNAME": "root", "LANG": "C.UTF-8",
        "PATH": f"{bin_dir}:{h.REPO / '.venv' / 'bin'}:{USER_PATH}",
        "SLURM_CONF": str(STATE / "slurm.conf"), "XDG_DATA_HOME": str(WORK / tag / "xdg"),
        "XDG_CONFIG_HOME": str(WORK / tag / "xdg"), "HPCLAUNCH_CLUSTER": "slurm",
    }  # fmt: skip
    argv = ["hpclaunch", "run", "-N", "2", "--wait", "--run-root", str(IMAGE_CWD / "runs"),
            "--container", str(WORK / "image.sqfs"), "--container-runtime", "charliecloud",
            "--", "true"]  # fmt: skip
    cmd = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
    took, done = h.run_timed(cmd, cwd=IMAGE_CWD, timeout=600)
    if done.returncode != 0:
        raise RuntimeError((done.stdout + done.stderr)[-800:])
    return {"s": took, "unpack_s": h.NAN, "mib": bytes_read(traces, WORK / "image.sqfs") / 2**20}


def measure(reps: int) -> dict[str, Any]:
    h.fresh(WORK)
    (WORK / "data.bin").write_bytes(os.urandom(SIZE))
    subprocess.run(["tar", "-cf", "data.tar", "data.bin"], cwd=WORK, check=True)
    subprocess.run(["chown", "-R", USER, str(WORK)], check=True)
    image = make_image() if (IMAGES / "debian-python").is_dir() else None
    methods: dict[str, Any] = {
        f"{nodes} node{'s' * (nodes > 1)}, {how}": (
            lambda rep, n=nodes, r=how == "per-node read": stage_once(n, r, rep)
        )
        for nodes in (1, 2)
        for how in ("sbcast", "per-node read")
    }
    if image:  # a --container image file (issue 33): 2 nodes only (1 never broadcasts)
        methods["2 nodes, image file, sbcast"] = lambda rep: image_once(False, rep)
        methods["2 nodes, image file, per-node read"] = lambda rep: image_once(True, rep)
    got = h.interleave(methods, reps, order=h.ALTERNATE, progress=h.print_metrics)
    return {"reps": reps, "facts": h.machine_facts(slurm=True), "kept": got.kept,
            "errors": got.errors,
            "image_mib": image.stat().st_size / 2**20 if image else 0}  # fmt: skip


def render(data: dict[str, Any]) -> list[str]:
    rows, verdicts = [], []
    for name, records in data["kept"].items():
        cols = h.columns(records)
        mib = h.median(cols.get("mib"))
        unpack = "(none: ch-run mounts it)" if "image" in name else h.fmt(cols.get("unpack_s"))
        rows.append([name, h.fmt(cols.get("s")), unpack,
                     f"{mib:.0f} MiB", str(len(records))])  # fmt: skip
    bcast = h.median(h.columns(data["kept"].get("2 nodes, sbcast", [])).get("mib"))
    verdicts.append(
        h.verdict(
            abs(bcast - SIZE / 2**20) < 1, f"2 nodes with sbcast read one copy: {bcast:.0f} MiB"
        )
    )
    image = data["kept"].get("2 nodes, image file, sbcast")
    if image and data.get("image_mib"):
        got = h.median(h.columns(image).get("mib"))
        verdicts.append(
            h.verdict(
                abs(got - data["image_mib"]) < 1,
                f"2 nodes with the image file sent by sbcast read one copy of it: {got:.0f} MiB "
                f"(the file: {data['image_mib']:.0f} MiB; the ranks' ch-run none)",
            )
        )
    verdicts += [f"{m} failed: {e}" for m, errors in data["errors"].items() for e in errors]
    head = ["nodes, method", "run --wait", "slowest unpack", "read from the shared copy", "n"]
    return [*h.table(head, rows), "", *[f"- {v}" for v in verdicts]]


def doc_section(body: list[str], data: dict[str, Any]) -> str:
    return h.section(
        "broadcast",
        "Scale: broadcast staging (`bench/broadcast.py`)",
        [
            f"Measured {data['facts']['date']}; {h.facts_line(data['facts'])}. A 64 MiB "
            "archive staged with `--stage` on 1 and 2 testbed nodes, sent with sbcast or "
            "read by each node (an sbcast that refuses); median (min-max) over n reps. Read "
            "from the shared copy: the bytes every `tar` and `sbcast` read from it, under "
            "`strace -f -y`. One node never broadcasts (nothing to share). The testbed's "
            "nodes share one disk, so the times show the cost of the extra step, not a "
            "shared file system's relief: that is the column of bytes, which at 1,000 nodes "
            "is 1,000 copies per-node against one with sbcast. The image rows: 2 nodes run "
            "`true` (the bootstrap's python3) in a Charliecloud SquashFS image file of the "
            "testbed's Python image (`--container`, as root for FUSE); bytes: every `sbcast` "
            "and `ch-run` read of the shared file. sbcast sends the whole file once, while "
            "each node's ch-run reads only the blocks it touches: here the broadcast reads "
            "more at 2 nodes and breaks even near size / (blocks read per node) nodes (about "
            "10 here); at 1,000 nodes it is one file against 1,000 nodes' reads.",
            "",
            *body,
            "",
            *h.reproduce(f"sudo .venv/bin/python bench/broadcast.py --reps {data['reps']}"),
        ],
    )


def main() -> int:
    parser = h.arguments(__doc__.splitlines()[0], reps=3, quick_reps=1)
    args = h.parse(parser)
    data = h.results(args, SAVED, lambda: measure(args.reps))
    h.publish(args, "broadcast", doc_section(render(data), data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
