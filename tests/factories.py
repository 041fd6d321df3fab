"""factory-boy factories for fairqueue's models, for tests that need rows in a given state.

Live jobs should come from fairqueue.enqueue (it places them); these factories are for rows whose
state a test wants to set directly: channels, workers and history.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import factory
from factory.alchemy import SQLAlchemyModelFactory
from sqlalchemy.orm import Session

from fairqueue import models


class _Base(SQLAlchemyModelFactory):
    class Meta:
        abstract = True
        sqlalchemy_session_persistence = "flush"


class ChannelFactory(_Base):
    class Meta:
        model = models.Channel

    name = factory.Sequence(lambda n: f"tenant-{n}")
    weight = 1


class WorkerFactory(_Base):
    class Meta:
        model = models.Worker

    name = factory.Sequence(lambda n: f"host:{1000 + n}")
    lease_expires_at = factory.LazyFunction(lambda: datetime.now(UTC) + timedelta(seconds=30))


class CompletedJobFactory(_Base):
    class Meta:
        model = models.CompletedJob

    job_id = factory.Sequence(lambda n: 1_000_000 + n)
    attempt = 1
    outcome = "succeeded"
    final = True
    kind = "report.build"
    channel = "tenant-0"
    args = factory.LazyFunction(dict)
    enqueued_at = factory.LazyAttribute(lambda o: o.finished_at - timedelta(seconds=2))
    started_at = factory.LazyAttribute(lambda o: o.finished_at - timedelta(seconds=1))
    finished_at = factory.LazyFunction(lambda: datetime.now(UTC))


def use_session(session: Session) -> None:
    """Points every factory at ``session`` (rows are flushed, the test commits or rolls back)."""
    for f in (ChannelFactory, WorkerFactory, CompletedJobFactory):
        f._meta.sqlalchemy_session = session  # type: ignore[attr-defined]
