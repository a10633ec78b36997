"""--after RUN[:ok|any|notok] and --chain K: what a run waits for.

Slurm forgets a finished job after MinJobAge (minutes), and `--dependency=afterok:J` on a
job it forgot is refused or never met. So hpclaunch resolves each --after from its own
records first: a run still queued or running becomes a Slurm dependency (with
`--kill-on-invalid-dep=yes`, so one that can never be met ends the job instead of
leaving it PENDING forever); a run that already ended is judged here, now: met (no
dependency needed) or never met (refused before anything is submitted). RUN may be a
sweep: all its points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpclaunch.basics import states
from hpclaunch.config.options import RunOptions
from hpclaunch.errors import UserError, show
from hpclaunch.records.refs import run_or_sweep

CONDITIONS = {"ok": "afterok", "any": "afterany", "notok": "afternotok"}
MAX_CHAIN = 100


@dataclass(frozen=True)
class After:
    """One --after, resolved: the run, the condition, what it waits for in Slurm."""

    given: str
    run_id: str
    run_dir: str
    condition: str  # ok | any | notok
    state: str  # the run's state (a sweep: its points' states joined) when resolved
    job_ids: tuple[str, ...]  # still active: the dependency's job ids; () when judged

    def to_record(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "run_dir": self.run_dir,
            "condition": self.condition,
            "state": self.state,
            "job_ids": list(self.job_ids),
        }


def parse(item: str) -> tuple[str, str]:
    """RUN[:ok|any|notok] -> (RUN, condition); the default is ok."""
    ref, sep, cond = item.rpartition(":")
    if sep and cond in CONDITIONS:
        return ref, cond
    if sep and not ref.count(":") and cond and not cond.isdigit():
        raise UserError(
            "--after",
            show(item),
            "RUN, RUN:ok, RUN:any or RUN:notok",
            f"Write e.g. --after {ref}:ok",
        )
    return item, "ok"


def check_chain(options: RunOptions, *, local: bool, in_allocation: bool) -> int:
    chain = 1 if options.chain is None else options.chain
    if not 1 <= chain <= MAX_CHAIN:
        raise UserError("--chain", str(chain), f"1 to {MAX_CHAIN}", "Give e.g. --chain 3")
    for name, given in (("--chain", chain > 1), ("--after", bool(options.after))):
        if given and (local or in_allocation):
            where = "a local run" if local else "a step of the current allocation"
            raise UserError(name, f"not for {where}", "Slurm keeps the order", "Drop it")
    if chain > 1 and options.requeue:
        raise UserError(
            "--chain",
            "with --requeue",
            "each is a way past the time limit",
            "Use --requeue where the site allows it, else --chain",
        )
    return chain


def resolve(items: Sequence[str], environ: Mapping[str, str]) -> list[After]:
    return [_resolve_one(item, environ) for item in items]


def _resolve_one(item: str, environ: Mapping[str, str]) -> After:
    ref, cond = parse(item)
    try:
        found = run_or_sweep(ref, environ)
    except UserError as exc:
        raise UserError(
            "--after", f"{show(item)}: {exc.problem}", exc.limit, exc.fix or "See hpclaunch runs"
        ) from None
    if found.is_sweep:
        run_id, state, active, ok = _sweep_state(found.folder)
    else:
        run_id, state, active, ok = _run_state(found.folder)
    run_dir = str(found.folder)
    if active:
        return After(item, run_id, run_dir, cond, state, tuple(active))
    met = cond == "any" or (ok if cond == "ok" else not ok)
    if not met:
        raise UserError(
            "--after",
            f"{show(item)}: {run_id} ended {state}",
            "so this run could never start",
            "Drop --after, or use :any" if cond == "ok" else "Drop --after, or use :ok",
        )
    return After(item, run_id, run_dir, cond, state, ())


def _run_state(run_dir: Path) -> tuple[str, str, list[str], bool]:
    from hpclaunch.backends import runstatus

    record = runstatus.refresh_one(run_dir)
    ids = record.job_ids or ([record.job_id] if record.job_id else [])
    if states.is_open(record.state):
        return record.run_id, record.state, ids[-1:], False
    return record.run_id, record.state, [], record.state == states.State.COMPLETED


def _sweep_state(sweep_dir: Path) -> tuple[str, str, list[str], bool]:
    from hpclaunch.backends import sweepstate

    sweep = sweepstate.refresh_all([sweep_dir])[0]
    counts = sweep.counts()
    text = " ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if sweep.active():
        arrays = [str(a["job_id"]) for a in sweep.data.get("arrays") or []]
        return sweep.sweep_id, text, arrays, False
    return sweep.sweep_id, text, [], set(counts) == {states.State.COMPLETED.value}


def sbatch_value(after: Sequence[After]) -> str:
    """--dependency's value for the runs still active: `afterok:1:2,afterany:3`."""
    parts = [f"{CONDITIONS[a.condition]}:{':'.join(a.job_ids)}" for a in after if a.job_ids]
    return ",".join(parts)
