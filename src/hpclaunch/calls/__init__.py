"""hpclaunch.call / hpclaunch.submit: a Python function on every rank of a job (calling),
the files it ships (files), the answer read back (outcome); node/callrank.py in the job."""
