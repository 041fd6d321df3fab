"""Maintenance: the chores one worker of the fleet does for everyone.

Exactly one worker at a time holds the maintenance role: the one whose dedicated connection holds a
session-level advisory lock. If that worker dies or loses its connection, PostgreSQL releases the
lock and another worker takes the role within a tick. Every chore is also safe to run concurrently
(each is a SKIP LOCKED or idempotent function), so the lock is about not wasting work, not safety.

Each tick: re-queue the jobs of workers whose lease expired (and delete those worker rows),
promote due scheduled jobs (delayed jobs, retries after backoff) even while every worker is busy,
and fire due periodic schedules (fairqueue.periodic).
Every ``vacuum_every`` seconds: vacuum the hot tables that have gathered many dead rows.
Every ``partition_every`` seconds: create ``completed_job`` partitions ``days_ahead`` days ahead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from psycopg import sql

from fairqueue._db import db_error_text, executor_for
from fairqueue.consumer import ensure_partitions, recover_expired_workers
from fairqueue.sql import Q

log = logging.getLogger("fairqueue.maintenance")


@dataclass
class MaintenanceReport:
    recovered_jobs: int = 0
    partitions_created: int = 0
    periodic_fired: int = 0
    vacuumed: tuple[str, ...] = ()


def try_become_maintainer(db: object) -> bool:
    """Takes the maintenance role for this session if nobody holds it (never waits)."""
    [(got,)] = executor_for(db).rows(Q.maintenance_lock)
    return bool(got)


# Every job leaves dead row versions in these (running_job: its claim's update and its delete; job:
# its delete). Autovacuum visits a table at most once per autovacuum_naptime (1 min by default), so
# at thousands of jobs/s they would grow to hold a minute of dead rows before space is reused.
HOT_TABLES = ("running_job", "job", "channel", "channel_wakeup", "channel_debt")
VACUUM_MIN_DEAD = 1_000


def vacuum_hot_tables(db: object, min_dead: int = VACUUM_MIN_DEAD) -> list[str]:
    """VACUUMs the hot tables with more than ``min_dead`` dead rows (and over a fifth of their live
    rows) that this role may vacuum; returns their names. ``db`` must be in autocommit mode. Skips a
    table another VACUUM holds instead of waiting for it."""
    ex = executor_for(db)
    tables = [name for (name,) in ex.rows(Q.hot_tables_to_vacuum, (list(HOT_TABLES), min_dead))]
    for name in tables:
        ex.rows(sql.SQL(Q.vacuum_table).format(table=sql.Identifier("fairqueue", name)).as_string())
    return tables


def promote_due_jobs(db: object) -> bool:
    """Makes due scheduled jobs ready; True if more are due right away."""
    [(more,)] = executor_for(db).rows(Q.promote_due_jobs)
    return bool(more)


class Maintainer:
    """Runs the chores at their intervals; call :meth:`tick` about once a second on an autocommit connection."""

    def __init__(self, *, days_ahead: int = 3, partition_every: float = 3600.0, vacuum_every: float = 10.0) -> None:
        from fairqueue.periodic import PeriodicRunner

        self.days_ahead = days_ahead
        self.partition_every = partition_every
        self.vacuum_every = vacuum_every
        self._next_partitions = 0.0
        self._next_vacuum = time.monotonic() + vacuum_every
        self.periodic = PeriodicRunner()

    def tick(self, db: object) -> MaintenanceReport:
        """Runs the chores that are due. A chore that fails does not keep the others from running: its
        error is logged and, once every chore has had its turn, the first one is raised (the worker
        then gives up the role with its connection). A broken connection is raised at once."""
        report = MaintenanceReport()
        errors: list[Exception] = []

        def chore(name: str, work: Callable[[], None]) -> None:
            try:
                work()
            except Exception as exc:
                if getattr(db, "broken", False) or getattr(db, "closed", False):
                    raise
                log.warning("maintenance chore failed", extra={"chore": name, "error": db_error_text(exc)})
                errors.append(exc)

        def recover() -> None:
            report.recovered_jobs = recover_expired_workers(db)
            if report.recovered_jobs:
                log.warning(
                    "re-queued jobs of workers whose lease expired", extra={"recovered_jobs": report.recovered_jobs}
                )

        def promote() -> None:
            for _ in range(10):  # a large due backlog moves 1,000 jobs per call
                if not promote_due_jobs(db):
                    break

        def fire_periodic() -> None:
            report.periodic_fired = sum(1 for job in self.periodic.tick(db).values() if job)

        def partitions() -> None:
            report.partitions_created = ensure_partitions(db, self.days_ahead)
            self._next_partitions = now + self.partition_every
            if report.partitions_created:
                log.info("created completed_job partitions", extra={"partitions": report.partitions_created})

        def vacuum() -> None:
            report.vacuumed = tuple(vacuum_hot_tables(db))
            if report.vacuumed:
                log.debug("vacuumed hot tables", extra={"tables": ",".join(report.vacuumed)})

        chore("recover expired workers", recover)
        chore("promote due jobs", promote)
        chore("fire periodic schedules", fire_periodic)
        now = time.monotonic()
        if now >= self._next_partitions:
            self._next_partitions = now + min(60.0, self.partition_every)  # after a failure: a minute
            chore("create partitions", partitions)
        if now >= self._next_vacuum:  # last: a long VACUUM holds up nothing else of this tick
            self._next_vacuum = now + self.vacuum_every
            chore("vacuum hot tables", vacuum)
        if errors:
            raise errors[0]
        return report
