"""count_steps.py (next to this file) whose later attempts step fast: the first attempt is
long enough to be sure to get the requeue signal, a resumed one (HPCLAUNCH_ATTEMPT > 0)
takes RESUMED_STEP_S (default 0.02 s) a step, so it ends before its own signal comes."""

import os
import runpy

if os.environ.get("HPCLAUNCH_ATTEMPT", "0") != "0":
    os.environ["STEP_S"] = os.environ.get("RESUMED_STEP_S", "0.02")
here = os.path.dirname(os.path.abspath(__file__))
runpy.run_path(os.path.join(here, "count_steps.py"), run_name="__main__")
