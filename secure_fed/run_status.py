"""A run's ``status`` (``summary.json``) and which statuses count as trained to the end (torch-free).

``completed``: every planned round ran and was applied. ``completed_with_aborts``: every planned round ran, but a
protocol aborted some of them (e.g. too few clients survived secure aggregation): nothing of those was applied,
yet a DP layer charged them (their cohort trained, and the abort is observable). ``budget_exhausted``: a DP layer
stopped the run at its budget. The three end with ``final.pt``, the model to release or export. ``failed``
(every round aborted), ``diverged`` and ``interrupted`` do not.
"""

from __future__ import annotations

COMPLETED = "completed"
COMPLETED_WITH_ABORTS = "completed_with_aborts"
BUDGET_EXHAUSTED = "budget_exhausted"

#: statuses of a run that trained to its end (``final.pt`` written): attacks, exports and exit status 0 accept them
TRAINED = (COMPLETED, COMPLETED_WITH_ABORTS, BUDGET_EXHAUSTED)


def trained(status: str | None) -> bool:
    """Whether a run with this status trained to its end."""
    return status in TRAINED
