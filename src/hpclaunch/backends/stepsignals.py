"""Ctrl-C (SIGTERM, SIGHUP) to hpclaunch while a step of an allocation runs (step.py):
as for a local run (localsignals.py), the first gives the ranks a grace period and says
so, a second ends them at once; the record keeps the signal as the user's.

What Slurm does with the step's srun (srun(1), slurm.conf(5), scancel(1) of Slurm 22.05;
measured on the testbed):
- With SLURM_DISABLE_STATUS=1 (srun -X) a single SIGINT to srun is forwarded to the
  step's tasks at once ("Instead immediately forward the SIGINT to the running job",
  https://slurm.schedmd.com/srun.html#OPT_disable-status); without it a single SIGINT
  only prints the tasks' states and a second within one second kills them
  (https://slurm.schedmd.com/srun.html#SECTION_SIGNALS-AND-ESCAPE-SEQUENCES).
- SIGTERM to srun ends the step at once ("srun: forcing job termination": its tasks are
  killed, srun exits 137 within a fraction of a second on the testbed).
- The grace N is the site's KillWait: "the interval, in seconds, given to a job's
  processes between the SIGTERM and SIGKILL signals"
  (https://slurm.schedmd.com/slurm.conf.html#OPT_KillWait), the time scancel gives a
  cancelled job's steps (https://slurm.schedmd.com/scancel.html, NOTES), so a step's
  ranks get from hpclaunch what Slurm gives them. srun runs in a session of its own
  (step.py), so a terminal's Ctrl-C reaches hpclaunch only and these are the only
  signals srun gets.
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Optional, TextIO

from hpclaunch.backends.localsignals import waiting_line

DISABLE_STATUS = "SLURM_DISABLE_STATUS"  # srun -X: one SIGINT reaches the tasks
DEFAULT_KILL_WAIT_S = 30.0  # slurm.conf(5)'s default KillWait


def kill_wait_s(config: Optional[dict[str, str]]) -> float:
    """KillWait of `scontrol show config` ("5 sec"), or Slurm's default without it."""
    words = (config or {}).get("KillWait", "").split()
    try:
        return float(words[0])
    except (IndexError, ValueError):
        return DEFAULT_KILL_WAIT_S


class StepStop:
    """The signals to hpclaunch handed on to one step's srun: the first Ctrl-C (or
    SIGTERM/SIGHUP, which srun would not pass on) becomes one SIGINT to the ranks and
    the grace period shown; a second signal, or the grace period's end, ends them."""

    def __init__(self, srun: subprocess.Popen[bytes], grace_s: float, err: TextIO) -> None:
        self.srun, self.grace_s, self.err = srun, grace_s, err
        self.signum: Optional[int] = None  # the first signal: the run's recorded cause
        self.ended_at_once = False
        self._deadline: Optional[float] = None

    def on_signal(self, signum: int) -> None:
        if self.signum is not None:
            self.end_now()
            return
        self.signum = signum
        self.err.write(waiting_line(signum, self.grace_s))
        self.err.flush()
        self._deadline = time.monotonic() + self.grace_s
        self._send(signal.SIGINT)

    def tick(self) -> None:
        """Called every poll: the grace period over, the ranks are ended."""
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self.end_now()

    def end_now(self) -> None:
        if not self.ended_at_once:
            self.ended_at_once = True
            self._send(signal.SIGTERM)

    def _send(self, signum: int) -> None:
        if self.srun.poll() is None:
            self.srun.send_signal(signum)
