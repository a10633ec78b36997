"""sbatch's refusal of a job, told apart from Slurm failing: when the controller rejects
the request ("Batch job submission failed", a site's job_submit filter among others), the
site's own words come back as one user error line (exit 2), not as a Slurm failure. A
profile's [[rules]] (planning/siterules.py) refuse the same jobs before sbatch."""

from __future__ import annotations

from hpclaunch.errors import SlurmError, UserError

REFUSED = "Batch job submission failed"
_PREFIX = "sbatch: error: "


class SiteRefused(UserError):
    """The site's Slurm refused the job at submission (nothing was queued)."""


def refusal(exc: SlurmError) -> SlurmError | SiteRefused:
    """`exc` as the site's refusal when sbatch says the controller rejected the job: the
    site's own lines (a filter's message), else Slurm's reason after "failed:"."""
    text = str(exc)
    if REFUSED not in text:
        return exc
    parts = text.removeprefix("sbatch failed: ").split("; ")
    said = [part.removeprefix(_PREFIX) for part in parts if REFUSED not in part]
    if not said:
        said = [part.split(REFUSED, 1)[1].lstrip(": ") for part in parts if REFUSED in part]
    return SiteRefused(
        "sbatch",
        "the site refused the job: " + "; ".join(said),
        "",
        "Change the request as the site says; a profile's [[rules]] can refuse it before "
        "sbatch (docs/sites.md)",
    )
