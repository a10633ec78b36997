"""The one runner of Slurm commands and what Slurm says of itself."""
