"""hpclaunch: run a training program unchanged on Slurm clusters or locally."""

__version__ = "0.1.0"
