"""Exceptions raised by fairqueue. All derive from :class:`FairqueueError`."""

from __future__ import annotations


class FairqueueError(Exception):
    """Base class of every error fairqueue raises on purpose."""


class InvalidJobError(FairqueueError, ValueError):
    """A job description was rejected before anything was written (bad kind, args, limits, ...)."""


class InvalidChannelConfigError(FairqueueError, ValueError):
    """A channel setting was rejected before anything was written (bad rate limit, weight, ...)."""


class DuplicateJobError(FairqueueError):
    """An unfinished job already holds this unique key (raised when ``on_duplicate='raise'``)."""

    def __init__(self, unique_key: str, existing_job_id: int) -> None:
        super().__init__(f"an unfinished job ({existing_job_id}) already holds unique key {unique_key!r}")
        self.unique_key = unique_key
        self.existing_job_id = existing_job_id


class UnknownWorkerError(FairqueueError):
    """The worker is not registered, or its lease expired and its jobs were recovered."""


class ConfigurationError(FairqueueError):
    """Something about the environment or a setting is wrong (database URL, driver, server)."""


class UnsupportedConnectionError(FairqueueError, TypeError):
    """``db`` is not a SQLAlchemy Session/Connection or a psycopg 3 connection."""
