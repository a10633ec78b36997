"""Run the bootstrap from cached bytecode: shipped into the run directory as
``bootstrap.py``, beside the bootstrap itself (``hpclaunch_bootstrap.py``).

A script given to ``python3`` is compiled on every start, and the bootstrap's compile
took about a third of its per-rank cost. Imported as a module instead, it is compiled
once (by hpclaunch at submission when its Python matches the nodes', else by the first
rank) into ``__pycache__/`` of the run directory, and every other rank loads the
bytecode. Where that folder cannot be written, Python compiles in memory as before.
``-I`` leaves the script's folder off sys.path, so the loader puts it there itself.
Standard library only, Python >= 3.8; it must not import hpclaunch.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hpclaunch_bootstrap  # type: ignore[import-not-found]  # beside this file

hpclaunch_bootstrap.main()
