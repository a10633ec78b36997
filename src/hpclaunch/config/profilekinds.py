"""Which backend a profile's kind or a run's record names, answered without loading any
backend: modules that the backends themselves import (render -> resources, profiling ->
stacks -> attach) ask here. The answers agree with the Backend classes' own attributes
(tests/test_layout.py checks it); everything else asks the chosen backend."""

from __future__ import annotations

_HERE = frozenset({"local"})  # LocalBackend.name and the local profiles' kind


def runs_here(name: str) -> bool:
    """The ranks are processes on this machine, no Slurm (a profile kind or a recorded backend)."""
    return name in _HERE
