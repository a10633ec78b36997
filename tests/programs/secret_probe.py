"""Prints whether WANDB_API_KEY arrived as expected (never the value), then waits so the
test can look at every process's command line."""

import hashlib
import os
import sys
import time

value = os.environ.get("WANDB_API_KEY", "")
print("digest", hashlib.sha256(value.encode()).hexdigest(), flush=True)
time.sleep(float(sys.argv[1]))
