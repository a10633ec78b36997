"""The exception tree: every user error prints one line and exits with code 2.

Format (stable, tests and users grep it):
    hpclaunch: error: <field>: <problem> (<limit>). <fix>
"""

from __future__ import annotations

USER_ERROR_EXIT = 2


class HpclaunchError(Exception):
    """Base of every error hpclaunch raises on purpose."""

    exit_code = 1

    def line(self) -> str:
        return f"hpclaunch: error: {self}"


class UserError(HpclaunchError):
    """A bad request: found before anything is submitted or written."""

    exit_code = USER_ERROR_EXIT

    def __init__(self, field: str, problem: str, limit: str = "", fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.limit = limit
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        text = f"{self.field}: {_one_line(self.problem)}"
        if self.limit:
            text += f" ({_one_line(self.limit)})"
        text += "."
        if self.fix:
            text += f" {_one_line(self.fix)}"
        return text


class NoController(UserError):
    """Slurm is here (SLURM_CONF, its commands, a profile naming a Slurm cluster) but no
    controller answers: never quietly a local run (doctor shows it as its controller line)."""


class SetupFailed(HpclaunchError):
    """A --setup line failed where the run starts (a local run, a step): the run folder
    and its record stay (FAILED, with `reason`); the message shows the lines' last output."""

    def __init__(self, returncode: int, reason: str, tail: list[str]) -> None:
        self.returncode = returncode
        self.reason = reason
        shown = "".join(f"\n  | {line}" for line in tail)
        super().__init__(reason + (f"; its last output lines:{shown}" if tail else ""))


class SlurmError(HpclaunchError):
    """Slurm refused or failed a command hpclaunch ran (sbatch, scancel, ...)."""

    exit_code = 1


def _one_line(text: str) -> str:
    """User values can hold newlines; the error format is one line, so show them escaped."""
    return text.replace("\n", "\\n").replace("\r", "\\r").rstrip(".")


def show(value: object) -> str:
    """A value as it appears inside an error message: quoted, control characters escaped."""
    return repr(value) if isinstance(value, str) else str(value)


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached hpclaunch: handled like Ctrl-C (every cleanup runs,
    the record says how the run ended), exit status 128+N."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
