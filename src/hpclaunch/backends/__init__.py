"""Backends: where a planned job runs (Slurm through its commands, or local processes)."""
