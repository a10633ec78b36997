"""An ordinary JAX multi-process program: `jax.distributed.initialize()` with no arguments
finds Slurm's variables itself. Writes <out>/jax-<process>.json."""

import json
import os
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize()
import jax.numpy as jnp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

total = multihost_utils.process_allgather(jnp.array([jax.process_index() + 1]))
record = {
    "process_index": jax.process_index(),
    "process_count": jax.process_count(),
    "global_devices": len(jax.devices()),
    "sum": int(total.sum()),
}
with open(os.path.join(sys.argv[1], f"jax-{jax.process_index()}.json"), "w") as handle:
    json.dump(record, handle)
jax.distributed.shutdown()
