"""Read-only views of jobs (their state and attempts) and channels."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fairqueue._db import Steps, arun, executor_for, run
from fairqueue.sql import Q
from fairqueue.validation import check_id

#: Where a live job can be. A finished job's status is its final outcome instead.
LIVE_STATES = ("scheduled", "blocked", "waiting", "ready", "running")


@dataclass(frozen=True, slots=True)
class Attempt:
    attempt: int
    outcome: str
    final: bool
    error: str | None
    worker_id: int | None
    started_at: datetime | None
    finished_at: datetime


@dataclass(frozen=True, slots=True)
class JobInfo:
    id: int
    kind: str
    channel: str
    args: dict[str, Any] | None
    status: str  # one of LIVE_STATES, or the final outcome (succeeded, failed, cancelled, ...)
    attempt: int
    worker_id: int | None
    run_at: datetime | None
    result: Any
    error: str | None
    enqueued_at: datetime
    finished_at: datetime | None
    attempts: list[Attempt]
    started_at: datetime | None = None  # when the attempt running now started (None unless running)
    priority: int = 0  # within its channel, higher first (-100 to 100); a retry keeps it
    not_before: datetime | None = None  # the run_at it was enqueued with (None once it has finished)
    fair_key: str | None = None  # the key it takes turns by within its channel; a retry keeps it

    @property
    def finished(self) -> bool:
        return self.status not in LIVE_STATES


def get_job(db: object, job_id: int) -> JobInfo | None:
    """The job's current state, result and attempt history; None if no such job. One statement reads
    them all, so they come from one snapshot in any transaction of the caller's."""
    return run(db, _get_job(job_id), "get_job")


async def aget_job(db: object, job_id: int) -> JobInfo | None:
    """:func:`get_job` for async code (``db`` as for :func:`fairqueue.aenqueue`)."""
    return await arun(db, _get_job(job_id), "aget_job")


def _get_job(job_id: object) -> Steps[JobInfo | None]:
    rows = yield Q.job_state, {"id": check_id("job_id", job_id)}
    if not rows:
        return None
    r = rows[0]
    attempts = [Attempt(*a) for a in zip(*(column or () for column in r[17:24]), strict=True)]
    return JobInfo(
        id=r[0],
        kind=r[1],
        channel=r[2],
        args=None if r[3] is None else json.loads(r[3]),
        status=r[6],
        attempt=r[7],
        worker_id=r[8],
        run_at=r[9],
        result=None if r[10] is None else json.loads(r[10]),
        error=r[11],
        enqueued_at=r[5],
        finished_at=r[12],
        attempts=attempts,
        started_at=r[13],
        priority=r[14],
        not_before=r[15],
        fair_key=r[16],
    )


def job_attempts(db: object, job_id: int) -> list[Attempt]:
    """Every finished attempt of a job, oldest first, from every day of the history (each day's primary
    key finds the job's rows)."""
    return [Attempt(*a) for a in executor_for(db).rows(Q.job_attempts, (check_id("job_id", job_id),))]


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    name: str
    weight: int
    max_concurrency: int | None
    rate_limit: str | None
    paused: bool
    active: bool
    running: int
    ready: int


def list_channels(db: object) -> list[ChannelInfo]:
    return [ChannelInfo(*r) for r in executor_for(db).rows(Q.channel_stats)]
