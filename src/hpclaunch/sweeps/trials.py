"""Asynchronous ask-and-tell on a sweep's Optuna journal.

Every sweep point (one Slurm array task) asks for a trial on its batch host before its
program starts and tells the result after. The study lives in `<sweep folder>/optuna.journal`,
a JournalFileBackend on the shared file system: its lock serialises journal writes between
points on different nodes. Reading a trial's state and then telling it can still race with
another point, so telling an already-finished trial is treated as done, never as an error.

Each trial carries user attrs `point` (the array index) and `job` (the Slurm task id such as
"123_4"); a requeued point finds its RUNNING trial by `point` and resumes it.

Optuna is imported inside the functions: `import hpclaunch.sweeps.trials` works without it."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Union

from hpclaunch.errors import UserError, show
from hpclaunch.sweeps.space import FIELD, SpaceParam, require_optuna, to_distributions

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

JOURNAL = "optuna.journal"
OPEN_LOCK = "optuna.journal.open-lock"  # present: the journal is locked with O_EXCL files
DIRECTIONS = ("minimize", "maximize")
POINT = "point"
JOB = "job"
FAIL_REASON = "fail_reason"
# A trial exists for a moment before `ask` labels it with its point. Unlabelled RUNNING
# trials younger than this belong to an ask in progress; older ones to a point that died
# inside `ask`, and are failed like any other stale trial.
UNLABELLED_GRACE = timedelta(minutes=10)

Value = Union[str, int, float, bool, None]
Alive = Callable[[Sequence[int]], "set[int]"]


def storage(sweep_dir: Path) -> optuna.storages.BaseStorage:
    """The sweep's journal storage (created empty when missing)."""
    _load()
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    # The default lock (a symlink, JournalFileSymlinkLock) works on NFS and Lustre, where
    # the batch hosts meet, and never uses flock: also where flock is refused. Where the
    # sweep folder takes no symlinks, submission chose Optuna's O_EXCL lock file for
    # every process (they must all take the same lock).
    path = str(sweep_dir / JOURNAL)
    lock = JournalFileOpenLock(path) if (sweep_dir / OPEN_LOCK).exists() else None
    return JournalStorage(JournalFileBackend(path, lock_obj=lock))


def _choose_lock(sweep_dir: Path) -> None:
    """For a new journal: Optuna's lock-file lock where no symlink can be made."""
    if (sweep_dir / JOURNAL).exists():
        return  # its processes already lock one way
    probe = sweep_dir / f".symlink-probe-{os.getpid()}"
    try:
        os.symlink(JOURNAL, probe)
    except OSError:
        os.close(os.open(sweep_dir / OPEN_LOCK, os.O_WRONLY | os.O_CREAT, 0o600))
    else:
        probe.unlink()


def create_study(sweep_dir: Path, study_name: str, direction: str) -> None:
    """Create the sweep's study at submission; an existing study of the same name must
    have the same direction."""
    _load()
    import optuna

    if direction not in DIRECTIONS:
        raise UserError(
            "--direction", f"unknown direction {show(direction)}", " | ".join(DIRECTIONS)
        )
    _choose_lock(sweep_dir)
    study = optuna.create_study(
        storage=storage(sweep_dir),
        study_name=study_name,
        direction=direction,  # type: ignore[arg-type]  # checked against DIRECTIONS above
        load_if_exists=True,
    )
    have = study.direction.name.lower()
    if have != direction:
        raise UserError(
            "--direction",
            f"study {study_name} in {sweep_dir / JOURNAL} already has direction {have}",
            "",
            f"Pass --direction {have}",
        )


def ask(
    sweep_dir: Path,
    study_name: str,
    space: Sequence[SpaceParam],
    point: int,
    job: str,
    alive: Alive,
) -> tuple[int, dict[str, Value]]:
    """The trial number and parameters for `point`: its own RUNNING trial when the point
    was requeued, else a new trial, after failing the trials of points that are gone."""
    study = _study(sweep_dir, study_name)
    running = _running(study)
    own = _own(running, point)
    if own is not None:
        return own.number, dict(own.params)
    # Stale trials go first so the sampler does not count them as still being evaluated.
    _fail_gone(study, running, alive, exclude=point)
    distributions = to_distributions(space)
    for _ in range(3):
        try:
            trial = study.ask(distributions)
            trial.set_user_attr(POINT, point)
            trial.set_user_attr(JOB, job)
        except _finished_errors():
            # Another point failed this trial while it was still unlabelled (only past
            # UNLABELLED_GRACE, so a very slow file system): take a fresh one.
            continue
        return trial.number, dict(trial.params)
    raise RuntimeError(f"point {point}: every new trial was failed by another point")


def tell(
    sweep_dir: Path,
    study_name: str,
    point: int,
    exit_code: int,
    result: Optional[Mapping[str, object]],
    metric: str,
) -> str:
    """Finish `point`'s RUNNING trial: COMPLETE with the metric when the program exited 0
    and reported a finite number under `metric`, else FAIL. Returns the state told; "FAIL"
    also when the trial was already failed by another point."""
    from optuna.trial import TrialState

    study = _study(sweep_dir, study_name)
    own = _own(_running(study), point)
    if own is None:
        return "FAIL"
    value, reason = _outcome(exit_code, result, metric)
    if value is not None:
        done = _finish(study, own, TrialState.COMPLETE, value=value)
    else:
        done = _finish(study, own, TrialState.FAIL, reason=reason)
    return "COMPLETE" if done and value is not None else "FAIL"


def fail_stale(sweep_dir: Path, study_name: str, alive: Alive) -> list[int]:
    """Fail the RUNNING trials whose points have left the queue (what `sweep status` runs);
    returns the numbers of the trials this call failed."""
    if not (sweep_dir / JOURNAL).exists():
        return []
    study = _study(sweep_dir, study_name)
    return _fail_gone(study, _running(study), alive, exclude=None)


def _load() -> None:
    require_optuna()
    import optuna

    # These calls run inside users' job logs: keep Optuna's per-trial INFO lines out.
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(sweep_dir: Path, study_name: str) -> optuna.Study:
    _load()
    import optuna

    try:
        return optuna.load_study(study_name=study_name, storage=storage(sweep_dir))
    except KeyError:
        raise UserError(
            FIELD,
            f"no study {show(study_name)} in {sweep_dir / JOURNAL}",
            "",
            "Submit the sweep again with --optuna",
        ) from None


def _running(study: optuna.Study) -> list[FrozenTrial]:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def _own(running: Sequence[FrozenTrial], point: int) -> Optional[FrozenTrial]:
    """The point's RUNNING trial; the newest if a race ever left two."""
    mine = [t for t in running if t.user_attrs.get(POINT) == point]
    return max(mine, key=lambda t: t.number) if mine else None


def _fail_gone(
    study: optuna.Study,
    running: Sequence[FrozenTrial],
    alive: Alive,
    exclude: Optional[int],
) -> list[int]:
    from optuna.trial import TrialState

    labelled = [t for t in running if isinstance(t.user_attrs.get(POINT), int)]
    points = sorted({t.user_attrs[POINT] for t in labelled} - {exclude})
    # One call: the caller answers from a single squeue, whatever the number of points.
    living = set(alive(points)) if points else set()
    now = datetime.now()  # Optuna keeps datetime_start as naive local time
    failed: list[int] = []
    for t in running:
        p = t.user_attrs.get(POINT)
        if not isinstance(p, int):
            started = t.datetime_start
            if started is None or now - started < UNLABELLED_GRACE:
                continue
            reason = "its point died while asking"
        elif p == exclude or p in living:
            continue
        else:
            reason = f"point {p} left the queue without telling a result"
        if _finish(study, t, TrialState.FAIL, reason=reason):
            failed.append(t.number)
    return failed


def _finish(
    study: optuna.Study,
    trial: FrozenTrial,
    state: optuna.trial.TrialState,
    *,
    value: Optional[float] = None,
    reason: str = "",
) -> bool:
    """Tell one trial; False when another process finished it first."""
    try:
        if reason:
            # Study has no public way to label a trial it holds no Trial object for.
            study._storage.set_trial_user_attr(trial._trial_id, FAIL_REASON, reason)
        told = study.tell(trial.number, value, state=state, skip_if_finished=True)
    except _finished_errors():
        return False
    # skip_if_finished hands back the trial as another process left it; a FAIL told by
    # another process just before ours reads as ours, which is the same outcome.
    return told.state == state and (value is None or told.value == value)


def _finished_errors() -> tuple[type[Exception], ...]:
    from optuna.exceptions import UpdateFinishedTrialError

    return (UpdateFinishedTrialError,)


def _outcome(
    exit_code: int, result: Optional[Mapping[str, object]], metric: str
) -> tuple[Optional[float], str]:
    """(the value to tell, None to fail) and why it fails."""
    if exit_code != 0:
        return None, f"the program exited with code {exit_code}"
    if result is None:
        return None, "the program exited 0 without a result"
    if metric not in result:
        return None, f"the result has no metric {show(metric)}"
    raw = result[metric]
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None, f"the metric {show(metric)} is {show(raw)}, not a number"
    value = float(raw)
    if not math.isfinite(value):
        return None, f"the metric {show(metric)} is {value}, not finite"
    return value, ""
