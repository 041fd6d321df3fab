"""The archive's error and its one option: :class:`ArchiveError` (every way a run stops; the partition it was
working on stays in PostgreSQL) and ``--older-than``, parsed here before anything connects."""

from __future__ import annotations

import logging
from datetime import timedelta

from fairqueue import durations
from fairqueue.errors import FairqueueError

APPLICATION = "fairqueue archive"  # the application_name of the archive's connections, and Spark's app name
log = logging.getLogger("fairqueue.spark.archive")  # the archive's one logger, whichever module logs


class ArchiveError(FairqueueError):
    """Archiving stopped; the history it was working on is still in PostgreSQL."""


class InvalidDurationError(ArchiveError, ValueError):
    """``--older-than`` is not a positive duration such as ``7d``."""


def parse_duration(text: str | timedelta, *, what: str = "--older-than") -> timedelta:
    """``7d``, ``12h``, ``30m``, ``2w`` (or ``90s``, ``1.5d``) as a timedelta; must be greater than zero.
    Unlike the report's durations, a unit is required: ``--older-than 7`` is more likely a typo than 7 s."""
    if isinstance(text, timedelta):
        delta = text
    else:
        stripped = str(text).strip()
        if not durations.has_unit(stripped):
            raise InvalidDurationError(
                f"{what} {text!r} is not a duration: give a number and a unit, e.g. 30m, 12h, 7d or 2w"
            )
        try:
            delta = timedelta(seconds=durations.parse_seconds(stripped, what=what, error=InvalidDurationError))
        except OverflowError:
            raise InvalidDurationError(f"{what} {text!r} is too long") from None
    if delta <= timedelta(0):
        raise InvalidDurationError(f"{what} must be greater than zero, got {text!r}")
    return delta
