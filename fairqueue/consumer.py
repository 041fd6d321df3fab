"""Worker side, low level: register workers, claim batches, record outcomes, recover lost jobs.

Each function is one round trip. Call them on a connection of their own in autocommit mode (each
call is then its own short transaction), or inside a transaction you control: a handler that wants
its own writes to commit together with its job's completion calls :func:`finish` in that transaction.
The worker runtime (``fairqueue worker``) is built on exactly these calls.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fairqueue._db import Steps, arun, executor_for, psycopg_error, run
from fairqueue.config import settings
from fairqueue.errors import InvalidJobError, UnknownWorkerError
from fairqueue.outcomes import WORKER_OUTCOMES, OutcomeName
from fairqueue.sql import Q
from fairqueue.validation import (
    MAX_ATTEMPTS,
    WORKER_SECONDS_BOUNDS,
    check_id,
    check_result,
    check_seconds,
    check_text,
)

OUTCOMES = WORKER_OUTCOMES  # (the name this module has always exported)


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    id: int
    kind: str
    args: dict[str, Any]
    channel: str
    attempt: int
    max_attempts: int
    timeout: float | None
    enqueued_at: datetime
    ready_at: datetime
    started_at: datetime
    priority: int = 0  # within its channel: higher ran first
    trace_context: dict[str, str] | None = None  # the W3C trace context current at enqueue
    fair_key: str | None = None  # within its channel, it took turns by this key


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one claimed job ended. ``retry_in`` (seconds) asks for another attempt after a failure;
    it is ignored once the job is out of attempts, and None means no retry."""

    job_id: int
    outcome: OutcomeName = "succeeded"
    result: Any = None
    error: str | None = None
    retry_in: float | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    job_id: int
    outcome: str
    final: bool
    retry_at: datetime | None


def register_worker(
    db: object, name: str | None = None, *, lease_seconds: float = 30.0, info: dict[str, Any] | None = None
) -> int:
    """Registers a worker and returns its id. Its lease must be renewed with :func:`heartbeat`."""
    _check_lease(lease_seconds)
    label = check_text("worker name", name or f"{socket.gethostname()}:{os.getpid()}", error=ValueError)
    [(worker_id,)] = executor_for(db).rows(Q.register_worker, (label, lease_seconds, json.dumps(info or {})))
    return int(worker_id)


def _check_lease(lease_seconds: object) -> None:
    """A lease becomes the worker's lease_expires_at: as long as a worker's setting may be (one day)."""
    longest = WORKER_SECONDS_BOUNDS["lease"]
    if (
        not isinstance(lease_seconds, int | float)
        or isinstance(lease_seconds, bool)
        or not 0 < lease_seconds <= longest  # also refuses nan
    ):
        raise ValueError(f"lease_seconds must be more than zero and at most {longest:g}, got {lease_seconds!r}")


def _worker_id(worker_id: object) -> int:
    return check_id("worker_id", worker_id, error=ValueError)


def heartbeat(db: object, worker_id: int, *, lease_seconds: float = 30.0) -> bool:
    """Renews the lease. False means the worker was declared dead and its jobs handed to others."""
    _check_lease(lease_seconds)
    [(alive,)] = executor_for(db).rows(Q.heartbeat, (_worker_id(worker_id), lease_seconds))
    return bool(alive)


def deregister_worker(db: object, worker_id: int) -> int:
    """Removes the worker; jobs it still holds are recorded as lost and run again. Returns their number."""
    [(n,)] = executor_for(db).rows(Q.deregister_worker, (_worker_id(worker_id),))
    return int(n)


def recover_expired_workers(db: object) -> int:
    """Re-queues the jobs of workers whose lease expired (attempt recorded as 'lost'). Returns how many."""
    [(n,)] = executor_for(db).rows(Q.recover_expired_workers)
    return int(n)


def claim_batch(db: object, worker_id: int, limit: int) -> list[ClaimedJob]:
    """Claims up to ``limit`` (1..1000) ready jobs in fair order, in one round trip."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000:
        raise ValueError(f"limit must be a whole number from 1 to 1000, got {limit!r}")
    worker_id = _worker_id(worker_id)
    try:
        rows = executor_for(db).rows(Q.claim, (worker_id, limit))
    except Exception as exc:
        driver_error = psycopg_error(exc)
        if driver_error is not None and driver_error.sqlstate == "FQ001":
            raise UnknownWorkerError(str(driver_error.diag.message_primary)) from None
        raise
    return [
        ClaimedJob(
            id=r[0],
            kind=r[1],
            args={} if r[2] == "{}" else json.loads(r[2]),
            channel=r[3],
            attempt=r[4],
            max_attempts=r[5],
            timeout=r[6],
            enqueued_at=r[7],
            ready_at=r[8],
            started_at=r[9],
            priority=r[10],
            trace_context=None if r[11] is None else json.loads(r[11]),
            fair_key=r[12],
        )
        for r in rows
    ]


def finish(db: object, worker_id: int, outcomes: Sequence[Outcome]) -> list[Finished]:
    """Records the outcomes of claimed jobs in one round trip.

    Jobs this worker no longer holds (its lease expired and they were recovered) are skipped:
    they are absent from the returned list.
    """
    if not outcomes:
        return []
    worker_id = _worker_id(worker_id)
    ids, names, results, errors, retries = [], [], [], [], []
    for o in outcomes:
        if o.outcome not in OUTCOMES:
            raise InvalidJobError(f"outcome must be one of {sorted(OUTCOMES)}, got {o.outcome!r}")
        ids.append(check_id("job_id", o.job_id))
        names.append(o.outcome)
        results.append(check_result(o.result, limit=settings.max_result_bytes))
        errors.append(o.error)
        # the retry's time is stored: at most 10 years ahead, like any delay
        retries.append(None if o.retry_in is None else check_seconds("retry_in", o.retry_in, allow_zero=True))
    if len(set(ids)) != len(ids):
        raise InvalidJobError("finish got the same job id twice")
    # an array of nothing but NULLs travels as one NULL (the common case: no results, no errors)
    params = (worker_id, ids, names, *(None if all(v is None for v in a) else a for a in (results, errors, retries)))
    rows = executor_for(db).rows(Q.finish, params)
    return [Finished(job_id=r[0], outcome=r[1], final=r[2], retry_at=r[3]) for r in rows]


def complete(db: object, worker_id: int, job_id: int, result: Any = None) -> bool:
    """Marks one job succeeded. False if this worker no longer held it."""
    return bool(finish(db, worker_id, [Outcome(job_id, "succeeded", result=result)]))


def fail(
    db: object,
    worker_id: int,
    job_id: int,
    error: str,
    *,
    retry_in: float | None = None,
    outcome: OutcomeName = "failed",
) -> Finished | None:
    """Records a failed attempt; with ``retry_in`` the job runs again then (if attempts remain)."""
    done = finish(db, worker_id, [Outcome(job_id, outcome, error=error, retry_in=retry_in)])
    return done[0] if done else None


def release(db: object, worker_id: int, job_ids: Iterable[int]) -> int:
    """Hands claimed, never-started jobs back to the queue (the attempt does not count)."""
    ids = [check_id("job_id", job_id) for job_id in job_ids]
    if not ids:
        return 0
    [(n,)] = executor_for(db).rows(Q.release, (_worker_id(worker_id), ids))
    return int(n)


def cancel(db: object, job_id: int) -> str:
    """Cancels a job: 'cancelled' (it will not run), 'cancel_requested' (running; its worker is told),
    'finished' (too late) or 'not_found'."""
    return run(db, _cancel(job_id), "cancel")


async def acancel(db: object, job_id: int) -> str:
    """:func:`cancel` for async code (``db`` as for :func:`fairqueue.aenqueue`)."""
    return await arun(db, _cancel(job_id), "acancel")


def _cancel(job_id: object) -> Steps[str]:
    [(state,)] = yield Q.cancel, (check_id("job_id", job_id),)
    return str(state)


def retry(db: object, job_id: int, *, attempts: int = 1) -> str:
    """Runs a job again by id (an operator's retry), in the transaction of ``db``. Returns:

    'retried' (it had ended without succeeding: queued again under the same id with ``attempts``
    more attempts), 'rescheduled' (it was waiting out a retry backoff: due now), 'queued' (it is
    live already: nothing changed), 'succeeded' (not run again), 'duplicate' (a live job holds its
    unique key), 'exhausted' (it used the most attempts a job can have) or 'not_found'.
    """
    return run(db, _retry(job_id, attempts), "retry")


async def aretry(db: object, job_id: int, *, attempts: int = 1) -> str:
    """:func:`retry` for async code (``db`` as for :func:`fairqueue.aenqueue`)."""
    return await arun(db, _retry(job_id, attempts), "aretry")


def _retry(job_id: object, attempts: object) -> Steps[str]:
    checked_id = check_id("job_id", job_id)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or not 1 <= attempts <= MAX_ATTEMPTS:
        raise InvalidJobError(f"attempts must be a whole number from 1 to {MAX_ATTEMPTS}, got {attempts!r}")
    [(state,)] = yield Q.retry, (checked_id, attempts)
    return str(state)


def ensure_partitions(db: object, days_ahead: int = 3) -> int:
    """Creates completed_job partitions from today to ``days_ahead`` days ahead; returns how many were new."""
    [(n,)] = executor_for(db).rows(Q.ensure_partitions, (days_ahead,))
    return int(n)
