"""`hpclaunch remote setup HOST` and `hpclaunch remote check HOST`.

Setup looks before it installs: a Python >= 3.9 that can make a venv, Slurm's commands
and a controller that answers, rsync. Only then are the wheels built here (this
hpclaunch packed from its installed files, its dependencies fetched by pip for the
cluster's Python) and shipped into ~/.hpclaunch/wheels; the venv ~/.hpclaunch/venv is
made anew from them with no package index. A refusal leaves nothing on either side.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpclaunch.errors import UserError
from hpclaunch.remote.build_id import fingerprint
from hpclaunch.remote.forward import VENV, remote_facts
from hpclaunch.remote.ssh import Connection, Host

WHEELS = ".hpclaunch/wheels"
MIN_PYTHON = (3, 9)
# Run by the cluster's Python (any 3.x, so old ones can say how old they are): facts as
# one JSON line. `scontrol ping` tells whether Slurm's controller answers.
PROBE = r"""
import json, os, platform, shutil, subprocess, sys
tools = dict((n, shutil.which(n)) for n in ("sbatch", "srun", "squeue", "sacct", "scontrol"))
ping = ""
if tools["scontrol"]:
    try:
        p = subprocess.Popen(["scontrol", "ping"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        ping = p.communicate()[0].decode("utf-8", "replace").strip()
    except OSError as exc:
        ping = str(exc)
try:
    import ensurepip, venv
    has_venv = True
except ImportError:
    has_venv = False
glibc = (os.confstr("CS_GNU_LIBC_VERSION") or "").split(" ")[-1]
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable,
    "machine": platform.machine(), "glibc": glibc, "has_venv": has_venv, "tools": tools,
    "ping": ping, "rsync": shutil.which("rsync"), "home": os.path.expanduser("~")}))
"""
# Made anew beside the old one, which stays in use until the new one is complete (a
# failed pip leaves the old install as it was); then swapped in, its scripts' paths
# mended. Arguments: venv, wheels, extras ("stack,plot" or "").
INSTALL = r"""
import glob, os, shutil, subprocess, sys
venv, wheels, extras = sys.argv[1], sys.argv[2], sys.argv[3]
new, old = venv + ".new", venv + ".old"
shutil.rmtree(new, ignore_errors=True)
subprocess.check_call([sys.executable, "-m", "venv", new])
own = glob.glob(os.path.join(wheels, "hpclaunch-*.whl"))
own = [w + ("[" + extras + "]" if extras else "") for w in own]
pip = [os.path.join(new, "bin", "python"), "-m", "pip", "install", "--quiet",
       "--disable-pip-version-check", "--no-index", "--find-links", wheels]
code = subprocess.call(pip + own)
if code:
    shutil.rmtree(new, ignore_errors=True)
    sys.exit(code)
full_new, full = os.path.abspath(new), os.path.abspath(venv)
for name in os.listdir(os.path.join(new, "bin")):
    path = os.path.join(new, "bin", name)
    if os.path.islink(path) or not os.path.isfile(path):
        continue
    with open(path, "rb") as f:
        data = f.read()
    if full_new.encode() in data:
        with open(path, "wb") as f:
            f.write(data.replace(full_new.encode(), full.encode()))
shutil.rmtree(old, ignore_errors=True)
if os.path.exists(venv):
    os.rename(venv, old)
os.rename(new, venv)
shutil.rmtree(old, ignore_errors=True)
"""


@dataclass(frozen=True)
class Probe:
    facts: dict[str, Any]

    @property
    def version(self) -> tuple[int, ...]:
        return tuple(int(x) for x in str(self.facts["python"]).split(".")[:2])

    def slurm_missing(self) -> list[str]:
        return [name for name, path in self.facts["tools"].items() if not path]

    def slurm_up(self) -> bool:
        return "UP" in str(self.facts.get("ping", ""))


def probe(conn: Connection, python: str) -> Probe:
    done = conn.run([python, "-c", PROBE], timeout=120)
    text = done.stdout.decode("utf-8", "replace").strip().splitlines()
    if done.returncode != 0 or not text:
        said = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
        raise UserError(
            "--python",
            f"{python!r} does not run on {conn.host.name} ({said})",
            "",
            "Give a Python >= 3.9 there: --python /path/to/python3",
        )
    return Probe(json.loads(text[-1]))


def refuse_unfit(found: Probe, host: str, python: str) -> None:
    """Everything setup needs, checked before anything is written."""
    if found.version < MIN_PYTHON:
        raise UserError(
            "--python",
            f"{python} on {host} is Python {found.facts['python']}",
            ">= 3.9",
            "Pass --python with a newer one (e.g. from a module: --python /appl/.../python3)",
        )
    if not found.facts["has_venv"]:
        raise UserError(
            "--python",
            f"{python} on {host} cannot make a venv (no ensurepip)",
            "",
            "Install python3-venv there, or pass another --python",
        )
    missing = found.slurm_missing()
    if missing:
        raise UserError(
            "--remote",
            f"{host} has no Slurm: {', '.join(missing)} not on PATH",
            "",
            "Give the cluster's login node (where sbatch works)",
        )
    if not found.slurm_up():
        raise UserError(
            "--remote",
            f"Slurm on {host} does not answer (scontrol ping: {found.facts['ping']})",
            "",
            "Check SLURM_CONF there, or try again when the controller is back",
        )
    if not found.facts.get("rsync"):
        raise UserError("--remote", f"{host} has no rsync", "", "Install rsync there")


def check_extras(wanted: Sequence[str]) -> None:
    from hpclaunch.remote.wheels import extras

    offered = extras()
    for name in wanted:
        if name not in offered:
            raise UserError(
                "--with", f"{name!r} is no extra of hpclaunch", f"one of {', '.join(offered)}", ""
            )


def setup(
    host: str,
    python: str,
    environ: Mapping[str, str],
    wanted: Sequence[str] = (),
    out: Any = sys.stdout,
) -> int:
    from hpclaunch.remote.wheels import dependencies, own_wheel

    check_extras(wanted)
    started = time.monotonic()
    conn = Connection(Host.parse(host), environ).open()
    try:
        found = probe(conn, python)
        refuse_unfit(found, conn.host.name, python)
    except UserError:
        conn.close()  # nothing was written there; leave no connection either
        raise
    cache = Path(environ.get("HOME") or Path.home()) / ".cache" / "hpclaunch" / "wheels"
    target = {
        "version": found.facts["python"],
        "machine": found.facts["machine"],
        "glibc": found.facts["glibc"],
    }
    folder = cache / f"py{'.'.join(map(str, found.version))}-{target['machine']}"
    folder.mkdir(parents=True, exist_ok=True)
    print(
        f"hpclaunch: {host}: Python {found.facts['python']} ({found.facts['executable']}), "
        f"Slurm answers; building wheels",
        file=out,
    )
    dependencies(folder, target, wanted)
    own = own_wheel(folder)
    sent = conn.rsync(
        ["-a", "--delete", "--stats", f"{folder}/", f":{WHEELS}/"], make_dir=".hpclaunch"
    )
    if sent.returncode != 0:
        raise UserError("--remote", f"shipping wheels to {host} failed ({sent.stderr.strip()})")
    done = conn.run([python, "-c", INSTALL, VENV, WHEELS, ",".join(wanted)], timeout=600)
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines() or ["failed"]
        raise UserError("remote setup", f"pip on {host} failed ({said[-1]})", "", "")
    facts = remote_facts(conn)
    if not facts or facts.get("build") != fingerprint():
        raise UserError("remote setup", f"the install on {host} does not answer as this one")
    wheels = len(list(folder.glob("*.whl")))
    print(
        f"hpclaunch: {host}: installed {own.name}"
        + (f" with {', '.join(wanted)}" if wanted else "")
        + f" and {wheels - 1} wheels it needs into "
        f"~/{VENV} in {time.monotonic() - started:.0f} s; "
        f"`hpclaunch --remote {host} runs` works now",
        file=out,
    )
    return 0


def check_rows(host: str, python: str, environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(what, PASS/FAIL, detail) rows; stops at a failed connection."""
    rows: list[tuple[str, str, str]] = []
    conn = Connection(Host.parse(host), environ)
    started = time.monotonic()
    reused = conn.alive()
    try:
        conn.open()
    except UserError as exc:
        return [("connection", "FAIL", exc.render())]
    how = "a master already running" if reused else f"in {time.monotonic() - started:.2f} s"
    rows.append(("connection", "PASS", f"ssh {host}: {how}"))
    started = time.monotonic()
    conn.run(["true"])
    again = time.monotonic() - started
    rows.append(
        (
            "multiplexing",
            "PASS" if conn.alive() else "FAIL",
            f"a second call in {again * 1000:.0f} ms over {conn.socket}",
        )
    )
    try:
        found = probe(conn, python)
    except UserError as exc:
        return [*rows, ("python", "FAIL", exc.render())]
    rows += _probe_rows(found, python)
    rows += _install_rows(conn)
    return rows


def _probe_rows(found: Probe, python: str) -> list[tuple[str, str, str]]:
    ok = found.version >= MIN_PYTHON and found.facts["has_venv"]
    rows = [
        (
            "python",
            "PASS" if ok else "FAIL",
            f"{python}: {found.facts['python']} ({found.facts['executable']})",
        )
    ]
    missing = found.slurm_missing()
    detail = f"missing: {', '.join(missing)}" if missing else str(found.facts["ping"])
    rows.append(("slurm", "PASS" if not missing and found.slurm_up() else "FAIL", detail))
    rows.append(
        (
            "rsync",
            "PASS" if found.facts.get("rsync") else "FAIL",
            str(found.facts.get("rsync") or "not on PATH"),
        )
    )
    return rows


def _install_rows(conn: Connection) -> list[tuple[str, str, str]]:
    facts = remote_facts(conn)
    fix = f"run hpclaunch remote setup {conn.host.name}"
    if facts is None:
        return [("hpclaunch", "FAIL", f"not installed in ~/{VENV}: {fix}")]
    same = facts["build"] == fingerprint()
    rows = [
        (
            "hpclaunch",
            "PASS" if same else "FAIL",
            f"{facts['version']} build {facts['build']}" + ("" if same else f": differs, {fix}"),
        )
    ]
    probe_file = ".hpclaunch/projects/.write-check"
    done = conn.run(["sh", "-c", 'mkdir -p "${1%/*}" && : > "$1" && rm -f "$1"', "sh", probe_file])
    rows.append(
        (
            "run root writable",
            "PASS" if done.returncode == 0 else "FAIL",
            f"~/{probe_file.rsplit('/', 1)[0]}",
        )
    )
    return rows
