"""hpclaunch dev --vscode on the node: the user's own sshd keeps the session's
environment for the logins it serves. sshd starts every login with a clean environment,
so the step's (the run's variables, its venv on PATH, Slurm's, the image's) is saved to
a private file before sshd starts, and sshd's ForceCommand runs this file again to put
it back before the login's command or shell.

The file may hold secrets the run was given: it lies in a fresh private folder of the
node's own temporary folder (mkdtemp, 0700; never the shared run folder), and `save`
stays sshd's parent to remove it when the step ends (the session's SIGUSR1 through
srun, a SIGTERM, or sshd's end).

Usage (Python >= 3.8, standard library only):
  python3 -I -S dev_sshd.py save -- SSHD [ARGS...]    # the step's command
  python3 -I -S dev_sshd.py enter ENV_FILE             # sshd's ForceCommand (given by save)
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Dict, List

# The login's own variables that win over the saved ones (who logged in, from where,
# its terminal); everything else comes from the step.
LOGIN_VARS = ("SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY", "SSH_ORIGINAL_COMMAND", "TERM",
              "SSH_AUTH_SOCK", "LANG", "LC_ALL")  # fmt: skip


def save(command: List[str]) -> int:
    folder = tempfile.mkdtemp(prefix="hpclaunch-dev-")  # 0700, an unpredictable name
    path = os.path.join(folder, "env.json")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(dict(os.environ), out)
        me = os.path.abspath(__file__)
        enter = shlex.join(["python3", "-I", "-S", me, "enter", path])
        sshd = subprocess.Popen([*command, "-o", "ForceCommand=" + enter])

        def stop(signum: int, frame: object) -> None:
            sshd.terminate()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        # The session ends the step with SIGUSR1, which srun passes on as it is (srun's
        # own SIGTERM aborts the step and its tasks were killed before this cleaned up).
        signal.signal(signal.SIGUSR1, stop)
        return sshd.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def enter(path: str) -> int:
    with open(path) as src:
        saved: Dict[str, str] = json.load(src)
    env = dict(saved)
    env.update({k: v for k, v in os.environ.items() if k in LOGIN_VARS or k.startswith("LC_")})
    for name in ("HOME", "USER", "LOGNAME", "SHELL"):
        if name in os.environ:
            env[name] = os.environ[name]
    wanted = os.environ.get("SSH_ORIGINAL_COMMAND")
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    # A login's command runs as sshd would run it (the shell's -c); no command: a shell
    # that keeps this PATH (a login shell's profile would put the venv's bin last).
    argv = [shell, "-c", wanted] if wanted else [shell, "-i"]
    os.execve(shell, argv, env)
    return 127  # not reached


def main(argv: List[str]) -> int:
    if len(argv) >= 3 and argv[0] == "save" and argv[1] == "--":
        return save(argv[2:])
    if len(argv) == 2 and argv[0] == "enter":
        return enter(argv[1])
    sys.stderr.write("usage: dev_sshd.py save -- SSHD [ARGS] | enter ENV_FILE\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
