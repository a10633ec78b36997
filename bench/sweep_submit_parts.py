"""The parts of a held sweep's submission that issue 26 cut, each alone, this tree
against a baseline tree (a harness, not a test). On a loaded machine the whole
submission's time (bench/sweep_submit.py) varies by more than these parts: each part
is timed here in-process, best of N, in one process per tree.

  diff (clean tree)         payload/snapshot.diff of a clean git project
  bootstrap bytecode        the shipped bootstrap copied and its bytecode made
  site queries              scontrol show config + sinfo + a sweep's sacctmgr
  start-up + imports        `python -c "import <what the sweep command imports>"`

    export SLURM_CONF=/var/tmp/hpclaunch-testbed/slurm.conf
    env -u PYTHONDONTWRITEBYTECODE .venv/bin/python bench/sweep_submit_parts.py [BASELINE]

BASELINE: a commit (default 1b5fb62, the tree before these changes), from `git archive`;
both trees are compiled first (compileall), as pip does at install.
"""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
IMPORTS = (
    "import hpclaunch.cli.main, hpclaunch.cli.group, hpclaunch.cli.sweep_cmd, hpclaunch.api, "
    "hpclaunch.sweeps.submit, hpclaunch.cli.sweep_report"
)
REPS = 15


def best(func: Callable[[], object], reps: int = REPS) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(src: str, project: Path) -> None:
    """In a process of its own: `src`'s hpclaunch, each part's best time on stdout."""
    sys.path.insert(0, src)
    from hpclaunch import node
    from hpclaunch.config.profiles import Profile
    from hpclaunch.payload import snapshot
    from hpclaunch.planning import preparing
    from hpclaunch.script import runfolder
    from hpclaunch.slurm import commands, discover
    from hpclaunch.sweeps import arrays, limits

    scratch = Path(tempfile.mkdtemp(dir=project.parent))

    def bytecode() -> None:
        folder = scratch / "run"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        shipped = folder / "hpclaunch_bootstrap.py"
        shutil.copyfile(node.path(node.BOOTSTRAP), shipped)
        if len(inspect.signature(runfolder.precompile).parameters) == 2:
            runfolder.precompile(shipped, node.path(node.BOOTSTRAP))
        else:
            runfolder.precompile(shipped)

    def site_queries() -> None:
        discover.slurm_config.cache_clear()
        discover.partitions.cache_clear()
        argv = arrays.sacctmgr_argv("root")
        together = getattr(limits, "asking_limits", None)
        if together is None:  # the baseline: in turn
            preparing._with_discovered(Profile(name="s", discover=True))
            commands.query(argv, timeout=10)
            return
        with together({"USER": "root"}):
            preparing._with_discovered(Profile(name="s", discover=True))
        from hpclaunch.slurm import along as asked

        asked.answer(argv, 10)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    probe = [sys.executable, "-c", f"import sys; sys.path.insert(0, {src!r}); {IMPORTS}"]
    found = {
        "diff (clean tree)": best(lambda: snapshot.diff(project)),
        "bootstrap bytecode": best(bytecode),
        "site queries": best(site_queries),
        "start-up + imports": best(lambda: subprocess.run(probe, env=env, check=True)),
    }
    shutil.rmtree(scratch)
    for name, took in found.items():
        print(f"{name}|{took * 1000:.1f}")


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--measure":
        measure(sys.argv[2], Path(sys.argv[3]))
        return 0
    baseline = sys.argv[1] if len(sys.argv) > 1 else "1b5fb62"
    top = Path(tempfile.mkdtemp(prefix="sweep-parts-", dir="/var/tmp"))
    try:
        archive = subprocess.run(["git", "archive", baseline, "src"], cwd=ROOT, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(top)], input=archive.stdout, check=True)
        project = top / "project"
        project.mkdir()
        (project / "train.py").write_text("print(1)\n")
        ident = ["-c", "user.name=b", "-c", "user.email=b@localhost"]
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "init"]):
            subprocess.run(["git", *ident, *args], cwd=project, check=True)
        rows: dict[str, dict[str, str]] = {}
        trees = {"this tree": str(ROOT / "src"), f"baseline {baseline}": str(top / "src")}
        for name, src in trees.items():
            subprocess.run([sys.executable, "-m", "compileall", "-q", src], check=True,
                           stdout=subprocess.DEVNULL)  # fmt: skip
            out = subprocess.run(
                [sys.executable, __file__, "--measure", src, str(project)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            for line in out.stdout.splitlines():
                part, took = line.split("|")
                rows.setdefault(part, {})[name] = took
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print(f"| part (best of {REPS}, ms) | " + " | ".join(trees) + " |")
    print("|---|" + "---|" * len(trees))
    for part, cells in rows.items():
        print(f"| {part} | " + " | ".join(cells.get(t, "") for t in trees) + " |")
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
