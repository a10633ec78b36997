"""Run the bootstrap from cached bytecode: shipped into the run directory as
``bootstrap.py``, beside the bootstrap itself (``hpclaunch_bootstrap.py``).

A script given to ``python3`` is compiled on every start, and the bootstrap's compile
took about a third of its per-rank cost. Imported as a module instead, it is compiled
once (by hpclaunch at submission when its Python matches the nodes', else by the first
rank) into ``__pycache__/`` of the run directory, and every other rank loads the
bytecode. Where that folder cannot be written, Python compiles in memory as before.
``-I`` leaves the script's folder off sys.path, so the loader puts it there itself.
Standard library only, Python >= 3.8; it must not import hpclaunch. Nor ``os``, whose
import costs ~2 ms per rank: the C module ``posix`` is loaded before any script runs.
"""

import posix
import sys

# This file's folder. Python >= 3.9 gives __main__ an absolute __file__; 3.8 keeps the
# path it was given, relative to the working directory.
sys.path.insert(
    0,
    (__file__ if __file__[:1] == "/" else posix.getcwd() + "/" + __file__).rpartition("/")[0]
    or "/",
)
import hpclaunch_bootstrap  # type: ignore[import-not-found]  # beside this file

hpclaunch_bootstrap.main()
