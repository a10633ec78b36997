"""Submitting from a laptop (issue 14): what SSH adds to a command, and what shipping
an unchanged project moves. Writes its section of docs/benchmarks.md.

The laptop is the testbed's user hpclaptop and the login node its sshd on
127.0.0.1:2222 (testbed/login.sh): loopback, so these are hpclaunch's and OpenSSH's own
costs without a network's round trip (add your link's RTT once per command).

(1) `status RUN`: the same command on the login node (hpcuser runs the cluster's
    hpclaunch, ~/.hpclaunch/venv/bin/hpclaunch) and from the laptop
    (`hpclaunch --remote testbed-login status RUN`, the master connection warm), and the
    floor: `ssh testbed-login true` over the same master. Interleaved, REPS reps.
(2) Shipping a 200 MB project (200 files of 1 MB of random bytes, untracked and not
    ignored: what a snapshot takes) with `run --dry-run`: first time, then unchanged,
    then with one file changed; rsync's own byte counts, both ways.

Environment: REPS (default 25), NO_DOC=1 (print only). Needs root (runuser) and the
testbed: export "$(sudo bash testbed/up.sh | tail -n 1)".
"""

from __future__ import annotations

import os
import platform
import pwd
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchdoc import write_section  # bench/ is on sys.path when run as a script

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import laptop as lp  # noqa: E402
import testbed  # noqa: E402

DOC = REPO / "docs" / "benchmarks.md"
MARK_START, MARK_END = "<!-- bench:remote:start -->", "<!-- bench:remote:end -->"
TARGET_S = 0.100
TARGET_MOVED = 1 << 20


def timed(argv: list[str], **kw: object) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    return time.perf_counter() - started, done


def on_login_node(*args: str) -> list[str]:
    home = pwd.getpwnam(testbed.USER).pw_dir
    env = {"HOME": home, "PATH": testbed.USER_PATH, "LANG": "C.UTF-8",
           "SLURM_CONF": str(testbed.conf_path())}  # fmt: skip
    return ["/usr/sbin/runuser", "-u", testbed.USER, "--", "/usr/bin/env", "-i",
            *(f"{k}={v}" for k, v in env.items()),
            f"{home}/.hpclaunch/venv/bin/hpclaunch", *args]  # fmt: skip


def med(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):.0f} ms ({min(ms):.0f}-{max(ms):.0f})"


def status_rows(project: lp.Laptop, reps: int) -> tuple[list[str], float]:
    started = project.run("--remote", lp.LOGIN, "run", "--json", "--wait", "--", "true")
    assert started.returncode == 0, started.stderr
    run_id = re.search(r'"run_id": "([^"]+)"', started.stdout)
    assert run_id, started.stdout
    rid = run_id.group(1)
    laptop_env = project.env()
    base = ["/usr/sbin/runuser", "-u", lp.USER, "--", "/usr/bin/env", "-u", "USER",
            "-u", "LOGNAME"]  # fmt: skip
    here: list[float] = []
    remote: list[float] = []
    floor: list[float] = []
    home = pwd.getpwnam(testbed.USER).pw_dir
    for _ in range(reps):
        t, done = timed(on_login_node("status", rid), cwd=home)
        assert done.returncode == 0, done.stderr
        here.append(t)
        t, done = timed([*base, lp.HPCLAUNCH, "--remote", lp.LOGIN, "status", rid],
                        env=laptop_env, cwd=project.cwd)  # fmt: skip
        assert done.returncode == 0, done.stderr
        remote.append(t)
        master = [*base, "ssh", "-o", f"ControlPath={control_socket()}", lp.LOGIN, "true"]
        t, done = timed(master, env=laptop_env, cwd=project.cwd)
        floor.append(t)
    extra = [r - h for r, h in zip(remote, here)]
    rows = [
        "| method | median (min-max) |",
        "|---|---|",
        f"| `status RUN` on the login node | {med(here)} |",
        f"| `hpclaunch --remote testbed-login status RUN` from the laptop | {med(remote)} |",
        f"| floor: `ssh testbed-login true` over the same master | {med(floor)} |",
        f"| added by SSH (paired, rep by rep) | {med(extra)} |",
    ]
    return rows, statistics.median(extra)


def control_socket() -> str:
    """The laptop's master socket, named as hpclaunch.remote.ssh names it (computed
    here: Connection() would make the folder as root)."""
    from hpclaunch.remote.ssh import Host, socket_name

    return f"{lp.home()}/.cache/hpclaunch/ssh/{socket_name(Host.parse(lp.LOGIN))}"


def moved(done: subprocess.CompletedProcess[str]) -> tuple[int, int]:
    found = re.search(r"shipped ([0-9]+) changed file\(s\) \(([0-9]+) bytes moved\)", done.stderr)
    assert found, done.stderr
    return int(found.group(1)), int(found.group(2))


def ship_rows(project: lp.Laptop) -> tuple[list[str], int]:
    data = project.cwd / "data200"
    data.mkdir()
    for i in range(200):
        (data / f"part-{i:03d}.bin").write_bytes(os.urandom(1 << 20))
    subprocess.run(["chown", "-R", f"{lp.USER}:{lp.USER}", str(data)], check=True)
    dry = ["--remote", lp.LOGIN, "run", "--dry-run", "--snapshot-limit", "1G", "--"]
    dry += ["python3", "train.py"]
    rows = [
        "| shipping 200 MB | files sent | bytes moved (both ways) | wall |",
        "|---|---|---|---|",
    ]
    again = 0
    for label in ("first time", "unchanged", "one file changed"):
        if label == "one file changed":
            project.write("train.py", "print('changed')\n")
        t, done = timed([str(x) for x in ["/usr/sbin/runuser", "-u", lp.USER, "--",
                        "/usr/bin/env", "-u", "USER", "-u", "LOGNAME", lp.HPCLAUNCH, *dry]],
                        env=project.env(), cwd=project.cwd)  # fmt: skip
        assert done.returncode == 0, done.stderr
        files, nbytes = moved(done)
        again = nbytes if label == "unchanged" else again
        rows.append(f"| {label} | {files} | {nbytes:,} | {t:.2f} s |")
    return rows, again


def tool_version(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return (done.stdout + done.stderr).strip().splitlines()[0]


def main() -> int:
    reason = lp.available() or (None if testbed.slurm_conf() else "the testbed is down")
    if reason:
        print(f"bench/remote.py: {reason}", file=sys.stderr)
        return 2
    reps = int(os.environ.get("REPS", "25"))
    home = lp.Laptop(lp.home())
    setup = home.run("remote", "setup", lp.LOGIN, timeout=900)
    assert setup.returncode == 0, setup.stderr
    project = lp.new_project({"train.py": "print('hello')\n"})
    try:
        status, added = status_rows(project, reps)
        ship, again = ship_rows(project)
    finally:
        lp.close_master()
        shutil.rmtree(project.cwd, ignore_errors=True)
        for mirror in (lp.login_home() / ".hpclaunch" / "projects").glob(f"{project.cwd.name}-*"):
            shutil.rmtree(mirror, ignore_errors=True)
    verdicts = [
        f"- {'PASS' if added < TARGET_S else 'MISS'}: SSH adds {added * 1000:.0f} ms to "
        f"`status` (median of paired differences; target < 100 ms)",
        f"- {'PASS' if again < TARGET_MOVED else 'MISS'}: an unchanged 200 MB project moves "
        f"{again:,} bytes (target < 1 MB)",
    ]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    section = "\n".join([
        MARK_START,
        "## Submitting from a laptop (`bench/remote.py`)",
        "",
        f"Measured {when}; nproc {os.cpu_count()}, python {platform.python_version()}, "
        f"{tool_version(['ssh', '-V'])}, {tool_version(['rsync', '--version'])}. "
        "The laptop (user hpclaptop) and the login node (hpcuser through sshd on "
        "127.0.0.1:2222) are this machine: loopback figures, no network round trip; a "
        f"real link adds its RTT once per command. REPS={reps}, interleaved; each "
        "command through runuser (the same cost on both sides).",
        "",
        *status,
        "",
        *ship,
        "",
        "### Targets",
        "",
        *verdicts,
        "",
        "Reproduce:",
        "",
        "```bash",
        'export "$(sudo bash testbed/up.sh | tail -n 1)"',
        "sudo .venv/bin/python bench/remote.py",
        "```",
        MARK_END,
    ])  # fmt: skip
    print(section)
    if os.environ.get("NO_DOC") != "1":
        write_section(DOC, MARK_START, MARK_END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
