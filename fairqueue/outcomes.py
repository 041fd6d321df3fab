"""The names of a job attempt's outcomes: one list, used by the API, the worker, the metrics, the
history report and the Django admin (the SQL check constraint on ``completed_job.outcome`` holds the
same names; tests/migrations checks the two agree)."""

from __future__ import annotations

from typing import Final, Literal, get_args

#: What a worker may record for an attempt it ran (``fairqueue.finish``).
OutcomeName = Literal["succeeded", "failed", "timed_out", "lost", "cancelled"]
WORKER_OUTCOMES: Final[frozenset[str]] = frozenset(get_args(OutcomeName))

#: Every outcome the history (``completed_job``) can hold, in the order reports list them:
#: the worker's, and ``dependency_failed`` for a job that never ran because a job it waited on failed.
HISTORY_OUTCOMES: Final[tuple[str, ...]] = (
    "succeeded",
    "failed",
    "timed_out",
    "lost",
    "cancelled",
    "dependency_failed",
)
