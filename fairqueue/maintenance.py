"""Maintenance: the chores one worker of the fleet does for everyone.

Exactly one worker at a time holds the maintenance role: the one whose dedicated connection holds a
session-level advisory lock. If that worker dies or loses its connection, PostgreSQL releases the
lock and another worker takes the role within a tick. Every chore is also safe to run concurrently
(each is a SKIP LOCKED or idempotent function), so the lock is about not wasting work, not safety.

Each tick: re-queue the jobs of workers whose lease expired (and delete those worker rows),
promote due scheduled jobs (delayed jobs, retries after backoff) even while every worker is busy,
and fire due periodic schedules (fairqueue.periodic).
Every ``partition_every`` seconds: create ``completed_job`` partitions ``days_ahead`` days ahead.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from fairqueue import statements as sql
from fairqueue._db import executor_for
from fairqueue.consumer import ensure_partitions, recover_expired_workers

log = logging.getLogger("fairqueue.maintenance")


@dataclass
class MaintenanceReport:
    recovered_jobs: int = 0
    partitions_created: int = 0
    periodic_fired: int = 0


def try_become_maintainer(db: object) -> bool:
    """Takes the maintenance role for this session if nobody holds it (never waits)."""
    [(got,)] = executor_for(db).rows(sql.MAINTENANCE_LOCK)
    return bool(got)


def promote_due_jobs(db: object) -> bool:
    """Makes due scheduled jobs ready; True if more are due right away."""
    [(more,)] = executor_for(db).rows(sql.PROMOTE_DUE_JOBS)
    return bool(more)


class Maintainer:
    """Runs the chores at their intervals; call :meth:`tick` about once a second on an autocommit connection."""

    def __init__(self, *, days_ahead: int = 3, partition_every: float = 3600.0) -> None:
        from fairqueue.periodic import PeriodicRunner

        self.days_ahead = days_ahead
        self.partition_every = partition_every
        self._next_partitions = 0.0
        self.periodic = PeriodicRunner()

    def tick(self, db: object) -> MaintenanceReport:
        report = MaintenanceReport()
        report.recovered_jobs = recover_expired_workers(db)
        if report.recovered_jobs:
            log.warning(
                "re-queued jobs of workers whose lease expired", extra={"recovered_jobs": report.recovered_jobs}
            )
        for _ in range(10):  # a large due backlog moves 1,000 jobs per call
            if not promote_due_jobs(db):
                break
        report.periodic_fired = sum(1 for job in self.periodic.tick(db).values() if job)
        now = time.monotonic()
        if now >= self._next_partitions:
            report.partitions_created = ensure_partitions(db, self.days_ahead)
            self._next_partitions = now + self.partition_every
            if report.partitions_created:
                log.info("created completed_job partitions", extra={"partitions": report.partitions_created})
        return report
