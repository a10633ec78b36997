"""What a sweep is before anything is written: its options and its plan (the types the
sweep modules share; submit.py makes them, folder.py writes them, local.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from hpclaunch import launching
from hpclaunch.config.secretnames import secret_values
from hpclaunch.records import runpaths
from hpclaunch.sweeps import arrays, script
from hpclaunch.sweeps.points import Point

if TYPE_CHECKING:
    from hpclaunch.backends.base import Backend
    from hpclaunch.sweeps.packplan import PackPlan


@dataclass(frozen=True)
class SweepOptions:
    grids: tuple[str, ...] = ()
    configs: Optional[str] = None
    repeat: Optional[int] = None
    max_parallel: Optional[int] = None
    optuna: Optional[str] = None
    trials: Optional[int] = None
    metric: Optional[str] = None
    direction: str = "minimize"
    wandb_sweep: Optional[str] = None
    count: Optional[int] = None
    # --pack: the points run in slots of whole-node allocations (sweeps/packing.py)
    pack: bool = False
    gpus_per_point: Optional[int] = None
    cpus_per_point: Optional[int] = None
    tasks_per_point: int = 1
    retries: int = 0
    point_time: Optional[str] = None
    pack_jobs: int = 1
    mem_per_point: Optional[str] = None

    def to_record(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class SweepPlan:
    planned: launching.Planned  # the sweep as one run: spec, profile, code, sweep paths
    options: SweepOptions
    points: list[Point]
    token: str
    point_template: str  # a point's job.sh with the token where its number goes
    array_script: str
    parts: list[arrays.ArrayPart]
    space: tuple[Any, ...] = ()  # Optuna's SpaceParam entries
    wandb_sweep: Optional[str] = None  # W&B: each point runs `wandb agent --count 1` this
    secret_env: tuple[tuple[str, str], ...] = ()  # sbatch's environment only (the API key)
    pack: Optional[PackPlan] = None  # --pack: slots, the agent's pack.json (sweeps/packplan)

    @property
    def paths(self) -> runpaths.RunPaths:
        return self.planned.paths

    @property
    def backend(self) -> Backend:
        """The backend that runs the points (a sweep is its own jobs, never steps)."""
        return self.planned.backend  # chosen once, by submit.plan_sweep

    @property
    def local(self) -> bool:
        """The points run here, in the foreground of `hpclaunch sweep`."""
        return self.backend.foreground

    def masked_secrets(self) -> list[tuple[str, str]]:
        """The secret values recorded as $NAME: the run's and the W&B key's."""
        return [*self.planned.spec.masked_secrets(), *secret_values(self.secret_env)]

    def sbatch_argvs(self) -> list[list[str]]:
        job_sh = self.paths.job_sh
        return [script.sbatch_argv(job_sh, p.spec(), p.offset) for p in self.parts]
