"""Per-rank start-up inside a container against without one, on a testbed node.

Runs hyperfine (-N, warm cache) on node1 of the Slurm testbed through `srun`, as the
unprivileged test user, over the exact per-task command lines hpclaunch generates
(hpclaunch.payload.containers.wrap + the bootstrap), with Charliecloud's ch-run and the image
testbed/image.sh builds. Prints a table and writes its section of docs/benchmarks.md.

    export "$(sudo bash testbed/up.sh | tail -n 1)"
    sudo bash testbed/image.sh
    sudo RUNS=30 .venv/bin/python bench/container.py
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from benchdoc import write_section  # bench/ is on sys.path when run as a script

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


from hpclaunch.config.jobspec import Bind, ContainerJob  # noqa: E402
from hpclaunch.payload.containers import ALWAYS_PASS, wrap  # noqa: E402

STATE = Path(os.environ.get("TESTBED_STATE", "/var/tmp/hpclaunch-testbed"))
IMAGE = STATE / "images" / "debian-python"
WORK = STATE / "work" / "bench-container"
USER = "hpcuser"
DOC = REPO / "docs" / "benchmarks.md"
MARK_START, MARK_END = "<!-- bench:container:start -->", "<!-- bench:container:end -->"
NODE = "node1"


def commands() -> dict[str, list[str]]:
    """name -> argv, all run on the node as the test user."""
    boot = str(WORK / "bootstrap.py")
    inside = "/mnt/bootstrap.py"  # WORK is bound at /mnt, which the image has
    job = ContainerJob(
        runtime="charliecloud",
        command="ch-run",
        image=str(IMAGE),
        binds=(Bind(src=str(WORK), dst="/mnt"),),
        cwd="/",
    )
    program = ["python3", "-c", "pass"]
    enter = ["python3", "-I", "-S", inside, "--hpclaunch-env-fd=3"]
    return {
        "python3 -c pass": program,
        "boot python3 -c pass (no container)": ["python3", "-I", "-S", boot, *program],
        "ch-run IMAGE -- true": ["ch-run", str(IMAGE), "--", "true"],
        "ch-run IMAGE -- python3 -c pass": ["ch-run", str(IMAGE), "--", *program],
        "hpclaunch task in container (boot python3 -c pass)": wrap(job, [*enter, *program]),
    }


def run(argv: list[str], **kw: object) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if done.returncode != 0:
        sys.exit(f"bench/container.py: {shlex.join(argv)} failed:\n{done.stdout}{done.stderr}")
    return str(done.stdout)


def measure(runs: int) -> dict[str, list[float]]:
    if not IMAGE.joinpath("usr/bin/python3").exists():
        sys.exit(f"bench/container.py: no image at {IMAGE}: run sudo bash testbed/image.sh")
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    shutil.copy(REPO / "src" / "hpclaunch" / "node" / "bootstrap.py", WORK / "bootstrap.py")
    cmds = commands()
    result = WORK / "hyperfine.json"
    hyper = ["hyperfine", "-N", "--warmup", "5", "--runs", str(runs), "--export-json", str(result)]
    hyper += [shlex.join(c) for c in cmds.values()]
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "USER": USER,
        "HOME": str(WORK),
        "SLURM_CONF": os.environ.get("SLURM_CONF", str(STATE / "slurm.conf")),
        # What a real task carries: the names the bootstrap keeps from fd 3.
        "HPCLAUNCH_CONTAINER_PASS": " ".join(ALWAYS_PASS),
    }
    srun = ["srun", "-N1", "-n1", f"--nodelist={NODE}", f"--chdir={WORK}", *hyper]
    runuser = shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin") or "runuser"
    argv = [runuser, "-u", USER, "--", *srun] if os.getuid() == 0 else srun
    if os.getuid() == 0:
        shutil.chown(WORK, USER, USER)
    run(argv, env=env, timeout=1800)
    results = json.loads(result.read_text())["results"]
    return {name: [float(t) for t in r["times"]] for name, r in zip(cmds, results)}


def ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.1f} ms ({min(xs) * 1e3:.1f}-{max(xs) * 1e3:.1f})"


def section(times: dict[str, list[float]], runs: int) -> str:
    names = list(times)
    base = statistics.median(times[names[1]])
    cont = statistics.median(times[names[4]])
    chrun = statistics.median(times[names[3]]) - statistics.median(times[names[0]])
    rows = [f"| `{n}` | {ms(t)} | {len(t)} |" for n, t in times.items()]
    version = subprocess.run(
        ["ch-run", "--version"], capture_output=True, text=True, env={**os.environ, "USER": USER}
    )
    chrun_version = (version.stdout + version.stderr).strip() or "unknown"
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            MARK_START,
            "## Container start-up per rank (`bench/container.py`)",
            "",
            f"Measured {when} on testbed {NODE} through `srun`, as the unprivileged user, "
            f"with hyperfine -N (5 warm-ups, warm page cache); nproc {os.cpu_count()}, kernel "
            f"{platform.release()}, ch-run {chrun_version}, image: Debian 12 minbase + "
            "python3 (testbed/image.sh, a directory image). The container row is the exact "
            "per-task command line hpclaunch generates: the bash wrapper that opens the "
            "environment pipe (fd 3), `ch-run --unset-env=*`, the bootstrap reading fd 3, "
            "then the program.",
            "",
            "| command | wall per start, median (min-max) | n |",
            "|---|---|---|",
            *rows,
            "",
            f"- Added per rank by the container path: **{(cont - base) * 1e3:+.1f} ms** "
            f"(container task {cont * 1e3:.1f} ms vs. bootstrap without container "
            f"{base * 1e3:.1f} ms, medians).",
            f"- Of that, ch-run itself costs {chrun * 1e3:+.1f} ms "
            "(`ch-run IMAGE -- python3 -c pass` minus `python3 -c pass`); the rest is "
            "the wrapper's bash and the environment hand-over.",
            "- Apptainer's own start-up is not measured: it cannot be installed on this "
            "machine kind (shared/TESTBED.md).",
            "",
            "Reproduce:",
            "",
            "```bash",
            'export "$(sudo bash testbed/up.sh | tail -n 1)" && sudo bash testbed/image.sh',
            f"sudo RUNS={runs} .venv/bin/python bench/container.py",
            "```",
            MARK_END,
        ]
    )


def write_doc(text: str) -> None:
    write_section(DOC, MARK_START, MARK_END, text)


def main() -> None:
    runs = int(os.environ.get("RUNS", "30"))
    times = measure(runs)
    text = section(times, runs)
    print(text)
    if os.environ.get("NO_DOC") != "1":
        write_doc(text)


if __name__ == "__main__":
    main()
