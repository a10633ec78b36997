"""Sweeps: many runs as Slurm job arrays."""
