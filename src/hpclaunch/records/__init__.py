"""What hpclaunch keeps of runs and sweeps: run folders' paths, run.json, the index,
attempts, sweep.json, and the one resolver of names."""
