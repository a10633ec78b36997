"""What reaches sbatch as the user or the site wrote it: `--sbatch-arg` items (refused
where hpclaunch models the flag itself, rows of the options registry included) and a
profile's [sbatch_lines] (a registry row's #SBATCH line respelled for the site)."""

from __future__ import annotations

from hpclaunch.config.options import BY_NAME, OPTIONS
from hpclaunch.config.profiles import Profile
from hpclaunch.errors import UserError, show

# sbatch options hpclaunch models itself: passing them raw would contradict the plan.
MODELED = {
    "-N": "-N/--nodes",
    "--nodes": "-N/--nodes",
    "-n": "--tasks-per-node",
    "--ntasks": "--tasks-per-node",
    "--ntasks-per-node": "--tasks-per-node",
    "-c": "--cpus-per-task",
    "--cpus-per-task": "--cpus-per-task",
    "--gpus-per-node": "--gpus-per-node",
    "-G": "--gpus-per-node",
    "--gpus": "--gpus-per-node",
    "--mem": "--mem",
    "--mem-per-gpu": "--mem-per-gpu",
    "-t": "-t/--time",
    "--time": "-t/--time",
    "-p": "-p/--partition",
    "--partition": "-p/--partition",
    "-A": "-A/--account",
    "--account": "-A/--account",
    "-J": "-J/--job-name",
    "--job-name": "-J/--job-name",
    "-o": "(hpclaunch's run directory)",
    "--output": "(hpclaunch's run directory)",
    "-e": "(hpclaunch's run directory)",
    "--error": "(hpclaunch's run directory)",
    "--exclusive": "--exclusive",
    "-O": "--overcommit",
    "--overcommit": "--overcommit",
    "--wrap": "(the program after --)",
    "-D": "(the directory you run hpclaunch in)",
    "--chdir": "(the directory you run hpclaunch in)",
    "--open-mode": "(append, always)",
    "--parsable": "(hpclaunch reads the job id itself)",
    "--requeue": "--requeue",
    "--no-requeue": "(no requeue unless --requeue)",
    "--signal": "--requeue with --requeue-signal and --signal-before",
    # Every registry row with an #SBATCH line (--reservation, --qos, ...): its own flag,
    # long and short (a row's short is sbatch's: -q, -C, -x, -w).
    **{opt.line.split("=")[0]: f"--{opt.name}" for opt in OPTIONS if opt.line},
    **{opt.short: f"--{opt.name}" for opt in OPTIONS if opt.line and opt.short},
}


def sbatch_args(items: tuple[str, ...]) -> tuple[str, ...]:
    for item in items:
        if any(c in item for c in "\n\r\x00"):
            raise UserError(
                "--sbatch-arg", f"{show(item)} holds a line break or NUL", "", "Remove it"
            )
        if not item.startswith("-"):
            raise UserError(
                "--sbatch-arg",
                f"{show(item)} is not an option",
                "",
                "Write e.g. --sbatch-arg=--qos=high",
            )
        key = item.split("=", 1)[0]
        if not key.startswith("--"):
            key = key[:2]  # -N2, -t5: a short option with its value attached
        if key in MODELED:
            raise UserError(
                "--sbatch-arg",
                f"{show(item)} is modelled by hpclaunch",
                "",
                f"hpclaunch sets it {MODELED[key]}; drop it"
                if MODELED[key].startswith("(")
                else f"Use hpclaunch's {MODELED[key]} instead",
            )
    return items


# The value as the row gives it ("{}"), and for gpus-per-node only also the job's total
# (Isambard-AI's --gpus={total}) and the GPUs of each task (Alps' --gpus-per-task={per_task}).
VALUE_HOLES = ("{}", "{total}", "{per_task}")


def spellings(profile: Profile) -> tuple[tuple[str, str], ...]:
    """A profile's [sbatch_lines]: a row's #SBATCH line respelled for the site, checked
    (a row that has a line; one hole for the value, VALUE_HOLES; one word: sbatch splits
    on blanks)."""
    for name, line in profile.sbatch_lines.items():
        row = BY_NAME.get(name)
        if row is None or not row.line:
            have = ", ".join(o.name for o in OPTIONS if o.line)
            raise UserError(
                f"cluster profile {profile.name}: sbatch_lines.{name}",
                "not an option with an #SBATCH line",
                f"one of {have}",
                "Fix the profile's [sbatch_lines]",
            )
        allowed = VALUE_HOLES if name == "gpus-per-node" else VALUE_HOLES[:1]
        holes = sum(line.count(hole) for hole in allowed)
        if holes != 1 or not line.startswith("-") or any(c.isspace() for c in line):
            raise UserError(
                f"cluster profile {profile.name}: sbatch_lines.{name}",
                f"{show(line)} is not one sbatch option holding one {{}}"
                + (" (or {total}, {per_task})" if len(allowed) > 1 else ""),
                "e.g. --gres=gpu:{}",
                "Fix the profile's [sbatch_lines]",
            )
    return tuple(sorted(profile.sbatch_lines.items()))
