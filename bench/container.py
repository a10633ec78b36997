"""Per-rank start-up inside a container against without one, on a testbed node.

Runs hyperfine (-N, warm cache) on node1 of the Slurm testbed through `srun`, as the
unprivileged test user, over the exact per-task command lines hpclaunch generates
(hpclaunch.payload.containers.wrap + the bootstrap), with Charliecloud's ch-run and the image
testbed/image.sh builds. Prints a table and writes its section of docs/benchmarks.md.

    export "$(sudo bash testbed/up.sh | tail -n 1)"
    sudo bash testbed/image.sh
    sudo .venv/bin/python bench/container.py [--runs 30] [--quick] [--no-doc | --doc FILE]

--render-only re-renders from the last run's samples (WORK/results.json); the
environment's RUNS and NO_DOC=1 still work.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import harness as h  # bench/ is on sys.path when run as a script

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


from hpclaunch.basics.shell import expand  # noqa: E402
from hpclaunch.config.jobspec import Bind, ContainerJob  # noqa: E402
from hpclaunch.payload.containers import ALWAYS_PASS, wrap  # noqa: E402

STATE = Path(os.environ.get("TESTBED_STATE", "/var/tmp/hpclaunch-testbed"))
IMAGE = STATE / "images" / "debian-python"
WORK = STATE / "work" / "bench-container"
USER = "hpcuser"
SAVED = WORK.parent / "bench-container-results.json"
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
        # hyperfine -N starts it without a shell: no word may be left for one to expand.
        "hpclaunch task in container (boot python3 -c pass)": [
            expand(w, {}) for w in wrap(job, [*enter, *program])
        ],
    }


def run(argv: list[str], **kw: Any) -> str:
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
    hyper = h.hyperfine_argv(cmds.values(), runs, result)
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
    return h.hyperfine_times(cmds, result)


def section(times: dict[str, list[float]], runs: int) -> str:
    names = list(times)
    base = h.median(times[names[1]])
    cont = h.median(times[names[4]])
    chrun = h.median(times[names[3]]) - h.median(times[names[0]])
    rows = [[f"`{n}`", h.fmt(t, "ms"), str(len(t))] for n, t in times.items()]
    version = subprocess.run(
        ["ch-run", "--version"], capture_output=True, text=True, env={**os.environ, "USER": USER}
    )
    chrun_version = (version.stdout + version.stderr).strip() or "unknown"
    return h.section(
        "container",
        "Container start-up per rank (`bench/container.py`)",
        [
            f"Measured {h.utc_now()} on testbed {NODE} through `srun`, as the unprivileged user, "
            f"with hyperfine -N (5 warm-ups, warm page cache); nproc {os.cpu_count()}, kernel "
            f"{platform.release()}, ch-run {chrun_version}, image: Debian 12 minbase + "
            "python3 (testbed/image.sh, a directory image). The container row is the exact "
            "per-task command line hpclaunch generates: the bash wrapper that opens the "
            "environment pipe (fd 3), `ch-run --unset-env=*`, the bootstrap reading fd 3, "
            "then the program.",
            "",
            *h.table(["command", "wall per start, median (min-max)", "n"], rows),
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
            *h.reproduce(
                'export "$(sudo bash testbed/up.sh | tail -n 1)" && sudo bash testbed/image.sh',
                f"sudo .venv/bin/python bench/container.py --runs {runs}",
            ),
        ],
    )


def main() -> None:
    p = h.arguments(__doc__.splitlines()[0], reps=30, quick_reps=3)
    p.add_argument("--runs", dest="reps", type=int, help="hyperfine runs per command")
    p.set_defaults(reps=int(os.environ.get("RUNS", "30")))
    args = h.parse(p)
    data = h.results(args, SAVED, lambda: {"runs": args.reps, "times": measure(args.reps)})
    h.publish(args, "container", section(data["times"], data["runs"]))


if __name__ == "__main__":
    main()
