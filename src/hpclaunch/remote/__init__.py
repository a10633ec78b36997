"""Submit from a laptop: every command runs the cluster's own hpclaunch over the user's
OpenSSH (docs/remote.md). ssh.py is the seam (one multiplexed connection: run a command
with standard input, sync a folder); choose.py decides where a command runs; forward.py
and ship.py are the laptop's side, serve.py the cluster's; setup.py installs and checks."""
