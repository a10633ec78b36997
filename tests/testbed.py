"""Helpers for tests that use the local Slurm testbed (``testbed/up.sh``).

The testbed is a two-node Slurm cluster on this machine: ``node1`` and ``node2``, each
a ``slurmd`` in its own network, UTS and mount namespace (own hostname, own private
``/tmp``), or, where namespaces are refused, two ``slurmd`` on localhost (see
:func:`layout`). Jobs are submitted as the unprivileged user :data:`USER`, as on a real
cluster, from the shared folder :func:`work_dir`.

Plain functions and constants only (no pytest fixtures), so any test module or script
can use them. Running commands as :data:`USER` needs root (``runuser``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

#: The unprivileged user that submits the tests' jobs.
USER = "hpcuser"
#: A second, unrelated user on the same machine and nodes (``up.sh`` makes it): the
#: shared-cluster tests plant files as it.
OTHER_USER = "hpcother"
#: The testbed's node names, in order.
NODES = ("node1", "node2")
#: Default state folder of ``testbed/up.sh`` (override with the ``TESTBED_STATE`` variable).
DEFAULT_STATE_DIR = Path("/var/tmp/hpclaunch-testbed")
#: PATH for commands run as :data:`USER`. Without root-only directories such as
#: ``/root/.pyenv``: use ``/usr/bin/python3`` for a venv that :data:`USER` creates.
USER_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"

# Slurm's own programs run as root (sinfo, squeue, scontrol) also need /usr/sbin etc.
_ROOT_PATH_EXTRA = "/usr/local/sbin:/usr/sbin:/sbin"


def state_dir() -> Path:
    """The testbed's state folder (``$TESTBED_STATE`` or :data:`DEFAULT_STATE_DIR`)."""
    env = os.environ.get("TESTBED_STATE")
    return Path(env) if env else DEFAULT_STATE_DIR


def conf_path() -> Path:
    """Where ``up.sh`` writes ``slurm.conf`` (whether or not the testbed is up)."""
    return state_dir() / "slurm.conf"


def work_dir() -> Path:
    """The shared folder that :data:`USER` owns (seen by both nodes, like a cluster FS)."""
    return state_dir() / "work"


def layout() -> str:
    """``"netns"`` (separate hostnames and /tmp per node) or ``"localhost"`` (fallback:
    same hostname and /tmp on both nodes, told apart only by ``SLURMD_NODENAME``)."""
    try:
        return (state_dir() / "layout").read_text().strip()
    except OSError:
        return "unknown"


def _slurm_env() -> dict[str, str]:
    env = dict(os.environ)
    env["SLURM_CONF"] = str(conf_path())
    env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":" + _ROOT_PATH_EXTRA
    return env


def _slurm(argv: list[str], timeout: float = 10) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command as the current user against the testbed."""
    return subprocess.run(
        argv, env=_slurm_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def slurm_conf() -> Path | None:
    """The testbed's ``slurm.conf`` when the testbed is up (the file exists and ``sinfo``
    answers within a few seconds), else ``None``."""
    conf = conf_path()
    if not conf.is_file():
        return None
    try:
        proc = _slurm(["sinfo", "-h", "-o", "%P"], timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return conf if proc.returncode == 0 and proc.stdout.strip() else None


def skip_reason() -> str | None:
    """Why the testbed tests cannot run here, or ``None`` when they can."""
    if slurm_conf() is None:
        return (
            f"Slurm testbed not running (no answer from sinfo with SLURM_CONF={conf_path()});"
            " start it with: sudo bash testbed/up.sh"
        )
    if os.geteuid() != 0:
        return f"testbed tests run commands as {USER} with runuser, which needs root"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"user {USER} missing; run testbed/up.sh"
    return None


def user_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A clean environment for commands run as :data:`USER`: HOME, USER, LOGNAME, PATH,
    SLURM_CONF and LANG, plus ``extra`` (which wins)."""
    try:
        home = pwd.getpwnam(USER).pw_dir
    except KeyError:
        home = f"/home/{USER}"
    env = {
        "HOME": home,
        "USER": USER,
        "LOGNAME": USER,
        "PATH": USER_PATH,
        "SLURM_CONF": str(conf_path()),
        "LANG": "C.UTF-8",
    }
    if extra:
        env.update(extra)
    return env


def run_as_user(
    argv: list[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as :data:`USER` in ``cwd`` (which that user must be able to enter),
    without a shell, with exactly the environment ``env`` (default :func:`user_env`).

    ``runuser`` would reset part of the environment itself, so the environment is set
    by ``env -i`` after the switch. Does not raise on a non-zero exit status.
    """
    environment = user_env() if env is None else env
    cmd = [
        "runuser", "-u", USER, "--",
        "env", "-i", *(f"{key}={value}" for key, value in environment.items()),
        *argv,
    ]  # fmt: skip
    return subprocess.run(
        cmd,
        cwd=cwd,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def node_names() -> list[str]:
    """The cluster's node names as Slurm lists them (sorted, each once)."""
    proc = _slurm(["sinfo", "-h", "-N", "-o", "%N"])
    return sorted(set(proc.stdout.split()))


def _idle_nodes() -> set[str]:
    return set(_slurm(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"]).stdout.split())


def _jobs() -> list[str]:
    return _slurm(["squeue", "-h", "-o", "%i %T %u %j"]).stdout.splitlines()


def wait_idle(timeout: float = 60) -> None:
    """Wait until no job is in ``squeue`` and every node is idle; raise TimeoutError
    (saying what is left) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = _jobs()
        idle = _idle_nodes()
        if not jobs and idle.issuperset(NODES):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"testbed not idle after {timeout:g}s: jobs={jobs!r}, idle nodes={sorted(idle)}"
            )
        time.sleep(0.2)


def jobs_from(folder: Path) -> list[str]:
    """The jobs in ``squeue`` (any state, array tasks folded) whose working directory is
    ``folder`` or below it, as ``"ID STATE"``: one test's jobs, since every test submits
    from its own folder (fixture ``hpc``) with ``--chdir`` there."""
    listed = _slurm(["squeue", "-h", "-o", "%i %T %Z"]).stdout.splitlines()
    prefix = str(folder).rstrip("/") + "/"
    return [
        " ".join(fields[:2])
        for fields in (line.split(maxsplit=2) for line in listed)
        if len(fields) == 3 and (fields[2] + "/").startswith(prefix)
    ]


def wait_jobs_gone(folder: Path, timeout: float = 60) -> None:
    """Wait until no job submitted from ``folder`` is left in ``squeue`` (:func:`jobs_from`);
    raise TimeoutError (saying which are left) after ``timeout`` seconds. What a test that
    shares the testbed with others running side by side waits for instead of
    :func:`wait_idle`, which would wait for the others' jobs too."""
    deadline = time.monotonic() + timeout
    while True:
        left = jobs_from(folder)
        if not left:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"jobs of {folder} still in squeue after {timeout:g}s: {left!r}")
        time.sleep(0.2)


def cancel_jobs_from(folder: Path) -> None:
    """scancel every job submitted from ``folder`` (:func:`jobs_from`): a failed test's
    leftovers, which would otherwise hold the nodes other tests wait for."""
    ids = sorted({line.split()[0].split("_")[0] for line in jobs_from(folder)})  # arrays whole
    if ids:
        _slurm(["scancel", *ids])


def procs_of_user_on_nodes() -> list[str]:
    """Processes of :data:`USER` still alive anywhere on the testbed, as ``"PID ARGS"``.

    The node namespaces share the host's PID namespace (``up.sh`` unshares only the
    network, UTS and mount namespaces), so ``ps`` on the host sees every node's tasks.
    """
    proc = subprocess.run(
        ["ps", "-u", USER, "-o", "pid=,args="],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    # ps exits 1 when there is no such process (or no such user): an empty list. The login
    # node's ssh sessions (testbed/login.sh; a laptop's master keeps one open) are not
    # the nodes' processes.
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    return [line for line in lines if not line.split(maxsplit=1)[-1].startswith(("sshd", "[sshd"))]


class first_job_id:
    """Make Slurm hand out ``job_id`` next (``FirstJobId`` + ``scontrol reconfigure``),
    and restore the configuration afterwards. Slurm 22.05's sbatch has no ``--jobid``;
    raising FirstJobId above the current sequence is how its controller is told."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.saved = ""

    def __enter__(self) -> first_job_id:
        conf = conf_path()
        self.saved = conf.read_text()
        _replace(conf, self.saved.rstrip("\n") + f"\nFirstJobId={self.job_id}\n")
        _slurm(["scontrol", "reconfigure"], timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        _replace(conf_path(), self.saved)
        _slurm(["scontrol", "reconfigure"], timeout=30)


def _replace(path: Path, text: str) -> None:
    """Write a file atomically: slurmd re-reads slurm.conf on reconfigure at a moment of
    its own choosing, and a truncated file makes it exit ("slurm.conf is empty")."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, path.stat().st_mode)
    os.replace(tmp, path)


class min_job_age:
    """Make slurmctld forget finished jobs soon (MinJobAge, `scontrol reconfigure`) and
    restore the configuration afterwards; it purges on its own cycle (every 60 s)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self.saved = ""

    def __enter__(self) -> min_job_age:
        conf = conf_path()
        self.saved = conf.read_text()
        text = "\n".join(
            f"MinJobAge={self.seconds}" if line.startswith("MinJobAge=") else line
            for line in self.saved.splitlines()
        )
        _replace(conf, text + "\n")
        _slurm(["scontrol", "reconfigure"], timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        _replace(conf_path(), self.saved)
        _slurm(["scontrol", "reconfigure"], timeout=30)


def known_to_controller(job_id: str) -> bool:
    """Whether slurmctld still holds the job's record (not yet purged)."""
    done = _slurm(["scontrol", "-o", "show", "job", job_id])
    return done.returncode == 0 and "JobId=" in done.stdout


# ---------------------------------------------------------------------------------
# Node crashes (testbed/crash-node.sh, testbed/restart-node.sh; netns layout only)
# ---------------------------------------------------------------------------------

#: The testbed's scripts (up.sh, down.sh, crash-node.sh, restart-node.sh).
SCRIPTS = Path(__file__).resolve().parents[1] / "testbed"


def crash_reason() -> str | None:
    """Why nodes cannot be crashed here (``None`` when they can): a node is the
    processes in its own network namespace, which only the netns layout has."""
    if layout() != "netns":
        return f"node crashes need the testbed's netns layout (this one is {layout()!r})"
    return None


def _script(name: str, node: str, timeout: float) -> None:
    env = {**os.environ, "TESTBED_STATE": str(state_dir())}
    done = subprocess.run(
        ["bash", str(SCRIPTS / name), node],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"testbed/{name} {node} failed ({done.returncode}): {done.stderr}")


def crash_node(name: str) -> None:
    """SIGKILL the node's slurmd and every process in it, as a power cut would.
    Slurm marks it DOWN (its jobs NODE_FAIL) after SlurmdTimeout (10 s)."""
    _script("crash-node.sh", name, timeout=30)


def restart_node(name: str, timeout: float = 60) -> None:
    """Start the node's slurmd again and wait until Slurm shows it up (idle, or running a
    job that waited for it). Nothing happens to a node whose slurmd runs."""
    _script("restart-node.sh", name, timeout=timeout + 15)


def node_state(name: str) -> str:
    """The node's state as ``sinfo -o %T`` prints it (``idle``, ``down*``, ...)."""
    lines = _slurm(["sinfo", "-h", "-N", "-n", name, "-o", "%T"]).stdout.split()
    return lines[0] if lines else ""


def slurmd_pid(name: str) -> int | None:
    """The PID of the node's slurmd as up.sh or restart-node.sh recorded it, when it
    still runs; ``None`` after a crash."""
    try:
        pid = int((state_dir() / "run" / f"testbed-slurmd-{name}.pid").read_text())
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return None if stat.rsplit(")", 1)[1].split()[0] == "Z" else pid


def node_tmp(name: str) -> list[str]:
    """What the node's own /tmp holds (names), read through its slurmd's mount
    namespace (no job needed); the host's /tmp in the localhost layout."""
    if layout() != "netns":
        return sorted(p.name for p in Path("/tmp").iterdir())
    pid = slurmd_pid(name)
    if pid is None:
        raise RuntimeError(f"{name} is down: its /tmp is gone with it")
    done = subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "--", "ls", "-1A", "/tmp"],
        capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip
    return sorted(done.stdout.split())


class node_crashes:
    """Crash nodes inside a ``with`` block; whatever happens in it, every node is up
    again afterwards (slurmd restarted, Slurm shows it up) and, when the block failed,
    :data:`USER`'s jobs are cancelled, so the next test finds an idle testbed.

    Entering waits until the testbed is idle: a crash must not hit another test's job.
    """

    def __init__(self, idle_timeout: float = 120) -> None:
        self.idle_timeout = idle_timeout

    def __enter__(self) -> node_crashes:
        wait_idle(timeout=self.idle_timeout)
        return self

    def crash(self, name: str) -> None:
        crash_node(name)

    def restart(self, name: str) -> None:
        restart_node(name)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        problems: list[str] = []
        for name in NODES:
            try:
                restart_node(name)
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                problems.append(str(error))
        if exc_type is not None:
            _slurm(["scancel", "-u", USER], timeout=30)
        try:
            wait_idle(timeout=self.idle_timeout)
        except TimeoutError as error:
            problems.append(str(error))
        if problems and exc_type is None:
            raise RuntimeError("; ".join(problems))


def node_procs(name: str) -> list[str]:
    """Processes inside the node other than its slurmd, as ``"PID ARGS"`` (job steps,
    batch shells, tasks; of any user). The netns layout only: elsewhere the nodes
    share the host's namespaces and ``[]`` is returned."""
    if layout() != "netns":
        return []
    listed = subprocess.run(
        ["ip", "netns", "pids", f"sl-{name}"],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    slurmd = slurmd_pid(name)
    found = []
    for word in listed.stdout.split():
        if not word.isdigit() or int(word) == slurmd:
            continue
        try:
            args = Path(f"/proc/{word}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # ended meanwhile
        found.append(f"{word} {args.strip()}")
    return found


def on_node(name: str, argv: list[str], user: str = OTHER_USER) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user`` inside node ``name``'s mount namespace (its private
    ``/tmp``), as a process of that user logged in on the node would; on the host in the
    localhost layout. Does not raise on a non-zero exit status."""
    prefix: list[str] = []
    if layout() == "netns":
        pid = slurmd_pid(name)
        if pid is None:
            raise RuntimeError(f"{name} is down")
        prefix = ["nsenter", "-t", str(pid), "-m", "--"]
    return subprocess.run(
        [*prefix, "runuser", "-u", user, "--", *argv],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def on_every_node(argv: list[str], user: str = OTHER_USER) -> None:
    """:func:`on_node` on each node; raises when it fails on one."""
    for name in NODES:
        done = on_node(name, argv, user)
        if done.returncode != 0:
            raise RuntimeError(f"{argv} as {user} on {name}: {done.stderr.strip()}")


class protected_symlinks_off:
    """``fs.protected_symlinks = 0`` inside a ``with`` block, restored afterwards.

    With the kernel's protection on (Debian's default), following another user's symlink
    in a sticky world-writable folder such as /tmp fails anyway; the shared-cluster tests
    turn it off so that they show hpclaunch's own checks, which must hold on a node whose
    kernel does not protect (and in folders that are not sticky, where it never does)."""

    PATH = Path("/proc/sys/fs/protected_symlinks")

    def __init__(self) -> None:
        self.saved: str | None = None

    def __enter__(self) -> protected_symlinks_off:
        try:
            self.saved = self.PATH.read_text().strip()
            if self.saved != "0":
                self.PATH.write_text("0\n")
        except OSError:
            self.saved = None  # not ours to change (e.g. a read-only /proc/sys): as it is
        return self

    def __exit__(self, *exc: object) -> None:
        if self.saved not in (None, "0"):
            self.PATH.write_text(self.saved + "\n")


@contextlib.contextmanager
def small_tmpfs(size: str, owner: str | None = None) -> Iterator[Path]:
    """A fresh tmpfs of `size` under /var/tmp (a full disk made to order; needs root),
    unmounted and removed afterwards. With `owner`: mode 0700 and that user's, as a run
    root of theirs would be."""
    mount = Path("/var/tmp") / f"hpclaunch-full-{uuid.uuid4().hex[:8]}"
    mount.mkdir()
    options = f"size={size},mode=0700" if owner else f"size={size}"
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], check=True)
        try:
            if owner:
                user = pwd.getpwnam(owner)
                os.chown(mount, user.pw_uid, user.pw_gid)
            yield mount
        finally:
            subprocess.run(["umount", "-l", str(mount)], check=False)
    finally:
        mount.rmdir()


def fill(folder: Path) -> Path:
    """Write until ENOSPC; returns the filler file (remove it to free the space)."""
    filler = folder / f"filler-{uuid.uuid4().hex[:6]}"
    with open(filler, "wb", buffering=0) as fh:
        for size in (1 << 20, 1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * size)
    return filler
