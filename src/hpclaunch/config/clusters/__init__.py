"""Built-in cluster profiles, as TOML data files (local, slurm, lumi)."""
