"""The installed hpclaunch's version, imported by whatever records it (run.json,
sweep.json, venvs, the remote build check) without importing the package face."""

__version__ = "0.1.0"
