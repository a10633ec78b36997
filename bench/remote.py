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

Options (bench/harness.py's): --reps (REPS, default 25), --quick, --no-doc (NO_DOC=1),
--doc FILE, --render-only (from the last run's remote-results.json in BENCH_SCRATCH).
Needs root (runuser) and the testbed: export "$(sudo bash testbed/up.sh | tail -n 1)".
"""

from __future__ import annotations

import os
import platform
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import harness as h  # bench/ is on sys.path when run as a script

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import laptop as lp  # noqa: E402
import testbed  # noqa: E402

SAVED = Path(os.environ.get("BENCH_SCRATCH", "/var/tmp/hpclaunch-bench")) / "remote-results.json"
TARGET_S = 0.100
TARGET_MOVED = 1 << 20


def on_login_node(*args: str) -> list[str]:
    home = pwd.getpwnam(testbed.USER).pw_dir
    env = {"HOME": home, "PATH": testbed.USER_PATH, "LANG": "C.UTF-8",
           "SLURM_CONF": str(testbed.conf_path())}  # fmt: skip
    return ["/usr/sbin/runuser", "-u", testbed.USER, "--", "/usr/bin/env", "-i",
            *(f"{k}={v}" for k, v in env.items()),
            f"{home}/.hpclaunch/venv/bin/hpclaunch", *args]  # fmt: skip


def status_samples(project: lp.Laptop, reps: int) -> dict[str, list[float]]:
    """`status RUN` on the login node, from the laptop, and the SSH floor, interleaved."""
    started = project.run("--remote", lp.LOGIN, "run", "--json", "--wait", "--", "true")
    assert started.returncode == 0, started.stderr
    run_id = re.search(r'"run_id": "([^"]+)"', started.stdout)
    assert run_id, started.stdout
    rid = run_id.group(1)
    laptop_env = project.env()
    base = ["/usr/sbin/runuser", "-u", lp.USER, "--", "/usr/bin/env", "-u", "USER",
            "-u", "LOGNAME"]  # fmt: skip
    home = pwd.getpwnam(testbed.USER).pw_dir

    def here(rep: int) -> float:
        t, done = h.run_timed(on_login_node("status", rid), cwd=home)
        assert done.returncode == 0, done.stderr
        return t

    def remote(rep: int) -> float:
        t, done = h.run_timed([*base, lp.HPCLAUNCH, "--remote", lp.LOGIN, "status", rid],
                              env=laptop_env, cwd=project.cwd)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return t

    def floor(rep: int) -> float:
        master = [*base, "ssh", "-o", f"ControlPath={control_socket()}", lp.LOGIN, "true"]
        return h.run_timed(master, env=laptop_env, cwd=project.cwd)[0]

    methods = {"here": here, "remote": remote, "floor": floor}
    return h.interleave(methods, reps, warmup=0, catch=()).kept


def status_rows(samples: dict[str, list[float]]) -> tuple[list[str], float]:
    here, remote, floor = samples["here"], samples["remote"], samples["floor"]
    extra = [r - t for r, t in zip(remote, here)]

    def ms(xs: list[float]) -> str:
        return h.fmt(xs, "ms", digits=0)

    rows = [
        ["`status RUN` on the login node", ms(here)],
        ["`hpclaunch --remote testbed-login status RUN` from the laptop", ms(remote)],
        ["floor: `ssh testbed-login true` over the same master", ms(floor)],
        ["added by SSH (paired, rep by rep)", ms(extra)],
    ]
    return h.table(["method", "median (min-max)"], rows), h.median(extra)


def control_socket() -> str:
    """The laptop's master socket, named as hpclaunch.remote.ssh names it (computed
    here: Connection() would make the folder as root)."""
    from hpclaunch.remote.ssh import Host, socket_name

    return f"{lp.home()}/.cache/hpclaunch/ssh/{socket_name(Host.parse(lp.LOGIN))}"


def moved(done: subprocess.CompletedProcess[str]) -> tuple[int, int]:
    found = re.search(r"shipped ([0-9]+) changed file\(s\) \(([0-9]+) bytes moved\)", done.stderr)
    assert found, done.stderr
    return int(found.group(1)), int(found.group(2))


def ship_samples(project: lp.Laptop) -> list[list[Any]]:
    """[label, files sent, bytes moved, wall s] of a first, an unchanged and a changed ship."""
    data = project.cwd / "data200"
    data.mkdir()
    for i in range(200):
        (data / f"part-{i:03d}.bin").write_bytes(os.urandom(1 << 20))
    subprocess.run(["chown", "-R", f"{lp.USER}:{lp.USER}", str(data)], check=True)
    dry = ["--remote", lp.LOGIN, "run", "--dry-run", "--snapshot-limit", "1G", "--"]
    dry += ["python3", "train.py"]
    rows: list[list[Any]] = []
    for label in ("first time", "unchanged", "one file changed"):
        if label == "one file changed":
            project.write("train.py", "print('changed')\n")
        t, done = h.run_timed([str(x) for x in ["/usr/sbin/runuser", "-u", lp.USER, "--",
                        "/usr/bin/env", "-u", "USER", "-u", "LOGNAME", lp.HPCLAUNCH, *dry]],
                        env=project.env(), cwd=project.cwd)  # fmt: skip
        assert done.returncode == 0, done.stderr
        files, nbytes = moved(done)
        rows.append([label, files, nbytes, t])
    return rows


def ship_rows(shipped: list[list[Any]]) -> tuple[list[str], int]:
    rows = [[label, str(files), f"{nbytes:,}", f"{t:.2f} s"] for label, files, nbytes, t in shipped]
    again = next(nbytes for label, _, nbytes, _ in shipped if label == "unchanged")
    head = ["shipping 200 MB", "files sent", "bytes moved (both ways)", "wall"]
    return h.table(head, rows), again


def measure(reps: int) -> dict[str, Any]:
    home = lp.Laptop(lp.home())
    setup = home.run("remote", "setup", lp.LOGIN, timeout=900)
    assert setup.returncode == 0, setup.stderr
    project = lp.new_project({"train.py": "print('hello')\n"})
    try:
        status = status_samples(project, reps)
        shipped = ship_samples(project)
    finally:
        lp.close_master()
        shutil.rmtree(project.cwd, ignore_errors=True)
        for mirror in (lp.login_home() / ".hpclaunch" / "projects").glob(f"{project.cwd.name}-*"):
            shutil.rmtree(mirror, ignore_errors=True)
    versions = {"ssh": h.first_line(["ssh", "-V"]), "rsync": h.first_line(["rsync", "--version"])}
    facts = {"date": h.utc_now(), "nproc": str(os.cpu_count()), "python": platform.python_version()}
    return {"reps": reps, "facts": {**facts, **versions}, "status": status, "shipped": shipped}


def render(data: dict[str, Any]) -> str:
    status, added = status_rows(data["status"])
    ship, again = ship_rows(data["shipped"])
    f, reps = data["facts"], data["reps"]
    verdicts = [
        h.verdict(
            added < TARGET_S,
            f"SSH adds {added * 1000:.0f} ms to `status` (median of paired differences; "
            "target < 100 ms)",
        ),
        h.verdict(
            again < TARGET_MOVED,
            f"an unchanged 200 MB project moves {again:,} bytes (target < 1 MB)",
        ),
    ]
    return h.section("remote", "Submitting from a laptop (`bench/remote.py`)", [
        f"Measured {f['date']}; nproc {f['nproc']}, python {f['python']}, {f['ssh']}, "
        f"{f['rsync']}. "
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
        *[f"- {v}" for v in verdicts],
        "",
        *h.reproduce(
            'export "$(sudo bash testbed/up.sh | tail -n 1)"',
            f"sudo .venv/bin/python bench/remote.py --reps {reps}",
        ),
    ])  # fmt: skip


def main() -> int:
    args = h.parse(h.arguments(__doc__.splitlines()[0], reps=25, quick_reps=2))
    reason = lp.available() or (None if testbed.slurm_conf() else "the testbed is down")
    if reason and not args.render_only:
        print(f"bench/remote.py: {reason}", file=sys.stderr)
        return 2
    data = h.results(args, SAVED, lambda: measure(args.reps))
    h.publish(args, "remote", render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
