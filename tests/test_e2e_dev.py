"""`hpclaunch dev` on the real two-node testbed (issue 36): a session's own allocation,
a shell on its first node inside the run's container, the allocation released after."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import testbed
from conftest import Hpc
from test_e2e_staging import _on_nodes

pytestmark = pytest.mark.testbed


def _in_terminal(hpc: Hpc, command: str, typed: str, timeout: float = 300) -> str:
    """`command` under script(1), a pseudo-terminal, with `typed` as the keyboard; its
    output, the exit code checked by the caller through the returned process."""
    proc = subprocess.run(
        ["runuser", "-u", testbed.USER, "--", "script", "-qec", command, "/dev/null"],
        input=typed, cwd=hpc.cwd, env=hpc.env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    return f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def _session_job(output: str) -> str:
    """The job id of `hpclaunch: session RUN: job J`."""
    line = next(ln for ln in output.splitlines() if "hpclaunch: session " in ln)
    return line.rsplit(" ", 1)[1].strip()


def _session_node(output: str) -> str:
    """The node of `hpclaunch: on NODE` (the session's first node: node1 or node2, as the
    testbed's other jobs leave room)."""
    line = next(ln for ln in output.splitlines() if ln.startswith("hpclaunch: on "))
    return line.rsplit(" ", 1)[1].strip()


def _job_gone(job_id: str, timeout: float = 60) -> bool:
    """The job left the queue (scancel's end takes a moment: COMPLETING first)."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T"],
            env={**testbed.user_env(), "SLURM_CONF": str(testbed.conf_path())},
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if not done.stdout.strip() or time.monotonic() > deadline:
            return not done.stdout.strip()
        time.sleep(1)


def test_dev_shell_runs_on_the_node_inside_the_container(hpc: Hpc, user_image: Path) -> None:
    typed = "tty; cat /hpclaunch-test-image; echo on-$SLURMD_NODENAME; exit 4\n"
    command = (
        f"hpclaunch dev --container {user_image} --container-runtime charliecloud "
        "--env DEV_MARK=dev-mark-1"
    )
    out = _in_terminal(hpc, command, typed.replace("exit 4", "echo $DEV_MARK; exit 4"))
    assert out.startswith("rc=4\n"), out
    assert "/dev/pts/" in out and "\nyes" in out, out  # a terminal, in the image
    node = _session_node(out)  # the session's node, where the shell must run
    assert "dev-mark-1" in out and f"on-{node}" in out, out  # the run's variables, its node
    job_id = _session_job(out)
    assert _job_gone(job_id), f"job {job_id} still in the queue"
    record = hpc.run("status", "last", "--json")
    assert '"CANCELLED"' in record.stdout or '"COMPLETED"' in record.stdout, record.stdout


# --- Jupyter ---------------------------------------------------------------------------

REPO_VENV = Path(__file__).resolve().parents[1] / ".venv"  # jupyter_server + ipykernel


class Session:
    """`hpclaunch dev ARGS` in the background as the test user; its stderr read line by
    line; Ctrl-C sent to hpclaunch itself (runuser would not pass it on)."""

    def __init__(
        self, cwd: Path, env: dict[str, str], *args: str, user: str = testbed.USER
    ) -> None:
        self.proc = subprocess.Popen(
            ["/usr/sbin/runuser", "-u", user, "--",
             "sh", "-c", 'echo "$$" >&2; exec "$@"', "sh", *args],
            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stderr is not None
        self.pid = int(self.proc.stderr.readline())
        self.lines: list[str] = []
        self.out = ""

    def until(self, marker: str, timeout: float = 600) -> str:
        """The first stderr line holding `marker` (lines before it kept in self.lines)."""
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            if marker in line:
                return line.strip()
        raise AssertionError(f"no {marker!r} in: " + "\n".join(self.lines))

    def interrupt(self, timeout: float = 120) -> int:
        os.kill(self.pid, signal.SIGINT)
        return self.finish(timeout)

    def finish(self, timeout: float = 120) -> int:
        """hpclaunch's exit code once it ends (its stdout kept in self.out)."""
        self.out, rest = self.proc.communicate(timeout=timeout)
        self.lines += rest.splitlines()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            self.proc.communicate(timeout=120)


def _get(url: str, token: str = "", method: str = "GET") -> tuple[int, bytes]:
    headers = {"Authorization": f"token {token}"} if token else {}
    req = urllib.request.Request(
        url, method=method, headers=headers, data=b"" if method == "POST" else None
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as answer:
            return int(answer.status), answer.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""


def _node_listeners(node: str) -> list[tuple[str, int]]:
    """(local address in /proc/net/tcp's hex, port) of every listening TCP socket in the
    node's network namespace (the host's in the localhost layout)."""
    prefix: list[str] = []
    if testbed.layout() == "netns":
        prefix = ["nsenter", "-t", str(testbed.slurmd_pid(node)), "-n", "--"]
    text = subprocess.run(
        [*prefix, "cat", "/proc/net/tcp", "/proc/net/tcp6"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    found = []
    for line in text.splitlines()[1:]:
        words = line.split()
        if len(words) > 3 and words[3] == "0A":  # TCP_LISTEN
            address, _, port = words[1].partition(":")
            found.append((address, int(port, 16)))
    return found


def _server_pid(node: str, port: int) -> int:
    """The session's jupyter_server on the node, told from others' by its port."""
    for line in testbed.node_procs(node):
        pid, _, args = line.partition(" ")
        if "jupyter_server" in args and f"--ServerApp.port={port}" in args:
            return int(pid)
    raise AssertionError(f"no server on port {port} on {node}")


def _ours(node: str, port: int) -> list[str]:
    """This session's processes on the node: its server and its relay (both name the
    port), or a kernel of its server."""
    found = []
    for line in testbed.node_procs(node):
        args = line.partition(" ")[2]
        if f"--ServerApp.port={port}" in args or ("relay" in args and args.endswith(f" {port}")):
            found.append(line)
    return found


def _kernel_pid(node: str, server: int) -> int:
    for _ in range(120):
        for line in testbed.node_procs(node):
            pid, _, args = line.partition(" ")
            if "ipykernel_launcher" in args and _parent(int(pid)) == server:
                return int(pid)
        time.sleep(0.5)
    raise AssertionError(f"no kernel of server {server} on {node}")


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def test_dev_jupyter_answers_with_its_token_only_and_ends_clean(hpc: Hpc) -> None:
    if testbed.layout() != "netns":
        pytest.skip("the node's processes and sockets are told apart in the netns layout")
    args = ("hpclaunch", "dev", "--jupyter", "--venv", str(REPO_VENV), "--env", "DEV_MARK=j-1")
    session = Session(hpc.cwd, hpc.env, *args)
    checked = check_jupyter(session, "hpclaunch: Jupyter: ", hpc.cwd / "runs")
    check_nothing_left(session, *checked)


def check_jupyter(session: Session, marker: str, runs: Path) -> tuple[str, int, int]:
    """The server answers with its token only, its kernel runs on the node with the run's
    variables (DEV_MARK=j-1) and the venv's Python, its port is on the node's loopback
    only: (node, the server's port there, the URL's port here)."""
    try:
        run_id = session.until("hpclaunch: session ").split()[2].rstrip(":")
        node = session.until("hpclaunch: on ").rsplit(" ", 1)[1]
        url = session.until(marker).split(marker, 1)[1]
        base, _, token = url.partition("/?token=")
        assert _get(f"{base}/api/status", token)[0] == 200
        assert _get(f"{base}/api/status")[0] == 403
        assert _get(f"{base}/api/status", "wrong-token")[0] == 403
        run_dir = next(runs.glob(f"*/{run_id}"))
        said = (run_dir / "logs" / "dev-jupyter.log").read_text()
        port = int(said.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])
        code, body = _get(f"{base}/api/kernels", token, method="POST")
        assert code == 201, body
        pid = _kernel_pid(node, _server_pid(node, port))
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"DEV_MARK=j-1" in environ and f"VIRTUAL_ENV={REPO_VENV}".encode() in environ
        assert any(e.startswith(b"HPCLAUNCH_RUN_DIR=") for e in environ)
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        assert argv0.startswith(str(REPO_VENV)), argv0
        assert _lightning_sees_slurm_task(environ) == "False"  # Trainer(devices=N) works
        assert _accelerate_sees(environ) == "DistributedType.NO DistributedType.NO"
        # ... and the probe tells: one variable of a task (srun's, torchrun's) would show.
        assert _accelerate_sees(environ, WORLD_SIZE="2").endswith(" DistributedType.MULTI_CPU")
        bound = {address for address, p in _node_listeners(node) if p == port}
        assert bound == {"0100007F"}, bound  # 127.0.0.1, nothing else
        return node, port, int(base.rsplit(":", 1)[1])
    except BaseException:
        session.kill()
        raise


def _lightning_sees_slurm_task(environ: list[bytes]) -> str:
    """What Lightning's own detection (SLURMEnvironment.detect) says in the kernel's
    exact environment: a Slurm task, or not."""
    env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
    code = "from lightning.fabric.plugins.environments import SLURMEnvironment as S\n"
    code += "print(S.detect())"
    done = subprocess.run(
        [str(REPO_VENV / "bin" / "python"), "-c", code],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done.stdout.strip() or done.stderr


ACCELERATE_PROBE = """from accelerate.state import PartialState
state = PartialState()
print(state.distributed_type, state._prepare_backend(cpu=True)[1])
"""


def _accelerate_sees(environ: list[bytes], **more: str) -> str:
    """accelerate's own detection in the kernel's exact environment (more: variables
    added): PartialState().distributed_type, then its _prepare_backend as on a CPU-only
    node (cpu=True: distributed when LOCAL_RANK is set or PMI_SIZE, OMPI_COMM_WORLD_SIZE,
    MV2_COMM_WORLD_SIZE or WORLD_SIZE > 1; huggingface/accelerate,
    src/accelerate/state.py), the check the testbed's GPU-less nodes can make."""
    env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
    done = subprocess.run(
        [str(REPO_VENV / "bin" / "python"), "-c", ACCELERATE_PROBE],
        env={**env, **more}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done.stdout.strip() or done.stderr


def check_nothing_left(session: Session, node: str, port: int, local_port: int) -> None:
    """After Ctrl-C: exit 130, no job, no server or relay on the node, no port there or
    here."""
    assert session.interrupt() == 130, session.lines
    assert any("interrupted" in line for line in session.lines), session.lines
    check_released(session, node, port, local_port)


def check_released(session: Session, node: str, port: int, local_port: int) -> None:
    """The session's job, its server and relay on the node and its ports are gone."""
    job_id = _session_job("\n".join(session.lines))
    assert _job_gone(job_id)
    assert not _ours(node, port)
    assert not [p for _, p in _node_listeners(node) if p == port]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", local_port), timeout=5).close()


def test_dev_jupyter_ends_clean_when_its_run_is_cancelled(hpc: Hpc) -> None:
    """`hpclaunch cancel RUN` from another terminal ends the session: hpclaunch says why,
    prints its --json end line, exits 0, and nothing is left (as after Ctrl-C)."""
    if testbed.layout() != "netns":
        pytest.skip("the node's processes and sockets are told apart in the netns layout")
    args = ("hpclaunch", "dev", "--jupyter", "--json", "--venv", str(REPO_VENV))
    session = Session(hpc.cwd, hpc.env, *args)
    assert session.proc.stdout is not None
    try:
        run_id = session.until("hpclaunch: session ").split()[2].rstrip(":")
        node = session.until("hpclaunch: on ").rsplit(" ", 1)[1]
        ready = json.loads(session.proc.stdout.readline())  # --json: the ready line
        assert ready["run_id"] == run_id, ready
        said = next((hpc.cwd / "runs").glob(f"*/{run_id}/logs/dev-jupyter.log")).read_text()
        port = int(said.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])
        assert _ours(node, port)  # the server and the relay run until the cancel
        cancelled = hpc.run("cancel", run_id)
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        ended = session.until("hpclaunch: session ended: ", timeout=300)
        assert session.finish() == 0, session.lines
    except BaseException:
        session.kill()
        raise
    assert ended.endswith("its job ended (CANCELLED)"), ended
    assert json.loads(session.out) == {"run_id": run_id, "ended": ended.split(": ", 2)[2]}
    check_released(session, node, port, int(ready["url"].split(":")[2].split("/")[0]))


# --- VS Code ----------------------------------------------------------------------------


def vscode_host(session: Session, marker: str) -> str:
    """The host name the session printed (`... connect to host hpclaunch-RUN (sshd ...)`)."""
    line = session.until(marker)
    return line.split("connect to host ", 1)[1].split()[0]


def entry_lines(config: Path, host: str) -> list[str]:
    text = config.read_text() if config.exists() else ""
    return [line for line in text.splitlines() if host in line]


def test_dev_vscode_reaches_the_node_through_its_entry(hpc: Hpc) -> None:
    """sshd on the node (no image): `ssh hpclaunch-RUN` lands in the allocation with the
    run's variables; the entry goes with the session."""
    args = ("hpclaunch", "dev", "--vscode", "--json", "--env", "DEV_MARK=v-1")
    session = Session(hpc.cwd, hpc.env, *args)
    config = Path(hpc.env["HOME"]) / ".ssh" / "config"
    try:
        host = vscode_host(session, "hpclaunch: VS Code: ")
        assert entry_lines(config, host)
        probe = "echo $DEV_MARK $SLURM_JOB_ID $SLURMD_NODENAME"
        done = hpc.cmd(["ssh", host, probe], timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        job_id = _session_job("\n".join(session.lines))
        node = _session_node("\n".join(session.lines))
        assert done.stdout.split() == ["v-1", job_id, node], done.stdout
        # hpclaunch.call from the session (as from a notebook): a step of its allocation.
        code = "import hpclaunch, os\n"
        code += "print(hpclaunch.call(lambda: os.environ['SLURM_JOB_ID'])[0])"
        python = str(REPO_VENV / "bin" / "python")
        called = hpc.cmd(["ssh", host, shlex.join([python, "-c", code])], timeout=300)
        assert called.returncode == 0, called.stdout + called.stderr
        assert called.stdout.split()[-1:] == [job_id], called.stdout
    except BaseException:
        session.kill()
        raise
    assert session.interrupt() == 130, session.lines
    shown = json.loads(session.out.splitlines()[0])  # --json: the ready line
    assert (shown["host"], shown["job_id"]) == (host, job_id), shown
    assert not entry_lines(config, host)
    assert _job_gone(job_id)
    # The keeper's private copy of the step's environment left the node's /tmp with it
    # (srun's SIGTERM killed the keeper before it could remove it: the session sends
    # SIGUSR1). Found by the job id inside, as other sessions may run beside this one.
    mine = f'grep -ls \'"SLURM_JOB_ID": "{job_id}"\' /tmp/hpclaunch-dev-*/env.json'
    left = _on_nodes(mine, as_root=True)
    assert not any(left.values()), left


def test_dev_session_ends_clean_at_its_time_limit(hpc: Hpc) -> None:
    """A one-minute session: its time shown, then the limit ends it (TIMEOUT): hpclaunch
    says so, stops the server and the relay, and exits."""
    args = ("hpclaunch", "dev", "--jupyter", "--venv", str(REPO_VENV), "-t", "1")
    session = Session(hpc.cwd, hpc.env, *args)
    try:
        run_id = session.until("hpclaunch: session ").split()[2].rstrip(":")
        node = session.until("hpclaunch: on ").rsplit(" ", 1)[1]
        left = session.until(" left; Ctrl-C ends the session")
        said = next((hpc.cwd / "runs").glob(f"*/{run_id}/logs/dev-jupyter.log")).read_text()
        port = int(said.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])
        assert left.endswith(
            (" s left; Ctrl-C ends the session", "1 min left; Ctrl-C ends the session")
        ), left
        ended = session.until("hpclaunch: session ended: ", timeout=300)
    except BaseException:
        session.kill()
        raise
    assert ended.endswith("its job ended (TIMEOUT)"), ended
    assert session.proc.wait(60) == 0
    assert _job_gone(_session_job("\n".join(session.lines)))
    assert not _ours(node, port)
