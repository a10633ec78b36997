"""An in-process stand-in for Slurm's commands: answers recorded from the testbed's real
Slurm 22.05 (tests/data/slurm-22.05/, written by tests/record_slurm.py), replayed at
hpclaunch's one command runner (``hpclaunch.slurm.commands.run`` and ``query``).

For unit tests of logic that only parses or decides: no job starts, nothing waits, and the
text is what Slurm really printed (not a hand-written guess). A command that was not
recorded fails the test, naming it, instead of answering something made up. Every
behaviour such a test covers keeps an end-to-end test on the real testbed.

    def test_x(slurm_replay: SlurmReplay) -> None:          # fixture in conftest.py
        slurm_replay.answer("squeue_tasks")                  # by the recording's name
        ...
        assert slurm_replay.calls == [["squeue", ...]]

submitit's tests, which mock ``subprocess`` under its one ``sacct`` watcher, are the model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hpclaunch.errors import SlurmError
from hpclaunch.slurm import commands

RECORDED = Path(__file__).resolve().parent / "data" / "slurm-22.05"


@dataclass(frozen=True)
class Recorded:
    """One answer of the real Slurm: the command, its exit status and its output."""

    name: str
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def recorded(name: str) -> Recorded:
    """The recording ``name`` (a file name in tests/data/slurm-22.05 without .json)."""
    data: dict[str, Any] = json.loads((RECORDED / f"{name}.json").read_text())
    return Recorded(
        name, tuple(data["argv"]), int(data["returncode"]), data["stdout"], data["stderr"]
    )


@dataclass
class SlurmReplay:
    """Answers the commands whose recordings were given (``answer``), the way
    ``slurmcmd.run`` would have: stdout, or SlurmError with Slurm's own reason."""

    answers: dict[tuple[str, ...], Recorded] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)

    def answer(self, *names: str) -> None:
        for name in names:
            found = recorded(name)
            self.answers[found.argv] = found

    def run(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        timeout: float = 0,
    ) -> str:
        self.calls.append(list(argv))
        found = self.answers.get(tuple(argv))
        if found is None:
            raise AssertionError(f"no recorded answer to {list(argv)}; recorded: {self.known()}")
        if found.returncode != 0:
            # The same reason slurmcmd.run builds from the real command's output.
            reason = commands.reason(found.stderr or found.stdout, found.returncode)
            raise SlurmError(f"{argv[0]} failed: {reason}")
        return found.stdout

    def query(self, argv: Sequence[str], timeout: float = 0) -> Optional[str]:
        try:
            return self.run(argv, timeout=timeout)
        except SlurmError:
            return None

    def known(self) -> list[str]:
        return sorted(found.name for found in self.answers.values())
