"""What travels with a run: project facts, the code snapshot, staged data, containers,
venvs."""
