"""The core reads the Django admin shows: a job's attempts (fairqueue.inspection.job_attempts) and how long
jobs waited to start (fairqueue.status.collect_wait_times), on a real database."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue.inspection import job_attempts
from fairqueue.status import collect_wait_times


def test_a_jobs_attempts_oldest_first_across_an_operators_retry(conn: psycopg.Connection[Any], worker: int) -> None:
    job_id = fairqueue.enqueue(conn, "k", channel="acme", max_attempts=1)
    assert job_attempts(conn, job_id) == []
    fairqueue.claim_batch(conn, worker, 1)
    fairqueue.fail(conn, worker, job_id, "first\nline two")
    assert fairqueue.retry(conn, job_id) == "retried"
    fairqueue.claim_batch(conn, worker, 1)
    fairqueue.complete(conn, worker, job_id, {"ok": True})
    attempts = job_attempts(conn, job_id)
    assert [(a.attempt, a.outcome, a.final, a.error, a.worker_id) for a in attempts] == [
        (1, "failed", True, "first\nline two", worker),
        (2, "succeeded", True, None, worker),
    ]
    assert attempts[0].finished_at <= attempts[1].finished_at and attempts[0].started_at is not None
    info = fairqueue.get_job(conn, job_id)
    assert info is not None and info.attempts == attempts


def test_get_job_shows_the_priority_while_queued_after_the_job_ended_and_after_a_retry(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    job_id = fairqueue.enqueue(conn, "k", channel="acme", priority=-7, max_attempts=1)
    plain = fairqueue.enqueue(conn, "k", channel="acme")
    queued = [fairqueue.get_job(conn, i) for i in (job_id, plain)]
    assert [(j.status, j.priority) for j in queued if j is not None] == [("ready", -7), ("ready", 0)]
    [claimed] = fairqueue.claim_batch(conn, worker, 1)  # plain first: 0 is above -7
    assert claimed.id == plain
    fairqueue.claim_batch(conn, worker, 1)
    fairqueue.fail(conn, worker, job_id, "boom")
    ended = fairqueue.get_job(conn, job_id)
    assert ended is not None and (ended.status, ended.priority) == ("failed", -7)  # read from its history
    assert fairqueue.retry(conn, job_id) == "retried"
    again = fairqueue.get_job(conn, job_id)
    assert again is not None and again.priority == -7 and not again.finished


def test_get_job_reads_the_job_and_its_attempts_in_one_snapshot(
    db_url: str, conn: psycopg.Connection[Any], worker: int
) -> None:
    """A poll while the job's attempt fails and the job waits to retry: another session's commit lands
    right after the poll's first statement. The poll shows the job before that commit (running, no
    attempt listed yet), never running with the running attempt's error already listed."""
    job_id = fairqueue.enqueue(conn, "k", max_attempts=3)
    [job] = fairqueue.claim_batch(conn, worker, 1)
    assert job.id == job_id
    commits: list[Callable[[], object]] = [lambda: fairqueue.fail(conn, worker, job_id, "attempt 1 broke", retry_in=0)]

    class CommitAfterEachStatement(psycopg.Cursor[Any]):
        def execute(self, *args: Any, **kwargs: Any) -> CommitAfterEachStatement:
            done = super().execute(*args, **kwargs)
            while commits:
                commits.pop()()
            return done

    with psycopg.connect(db_url, autocommit=True, cursor_factory=CommitAfterEachStatement) as poller:
        polled = fairqueue.get_job(poller, job_id)
    assert commits == []  # the other session committed during the poll
    assert polled is not None and (polled.status, polled.attempt, polled.attempts) == ("running", 1, [])

    after = fairqueue.get_job(conn, job_id)
    assert after is not None and after.status == "scheduled"
    assert [(a.attempt, a.outcome, a.error) for a in after.attempts] == [(1, "failed", "attempt 1 broke")]


def _finished(conn: psycopg.Connection[Any], job_id: int, channel: str, waited: float, hours_ago: float = 0) -> None:
    conn.execute(
        """
        INSERT INTO fairqueue.completed_job (job_id, attempt, outcome, final, kind, channel, enqueued_at, ready_at,
                                             started_at, finished_at)
        VALUES (%(id)s, 1, 'succeeded', true, 'k', %(channel)s, now() - %(ago)s * interval '1 hour',
                now() - %(ago)s * interval '1 hour', now() - %(ago)s * interval '1 hour' + %(waited)s * interval '1 s',
                now() - %(ago)s * interval '1 hour' + %(waited)s * interval '1 s')
        """,
        {"id": job_id, "channel": channel, "ago": hours_ago, "waited": waited},
    )


def test_wait_times_per_channel_and_overall_within_the_window(conn: psycopg.Connection[Any]) -> None:
    nothing = {"count": 0, "p50_seconds": None, "p95_seconds": None}
    assert collect_wait_times(conn, 1.0) == {"overall": nothing, "channels": {}}
    for job_id, waited in enumerate([1.0, 2.0, 3.0], start=1):
        _finished(conn, job_id, "acme", waited)
    _finished(conn, 10, "other", 10.0)
    _finished(conn, 11, "old", 99.0, hours_ago=5)  # outside the window
    waits = collect_wait_times(conn, 1.0)
    assert set(waits["channels"]) == {"acme", "other"}
    acme = waits["channels"]["acme"]
    assert acme["count"] == 3
    assert acme["p50_seconds"] == pytest.approx(2.0)
    assert acme["p95_seconds"] == pytest.approx(2.9)
    assert waits["channels"]["other"] == {"count": 1, "p50_seconds": 10.0, "p95_seconds": 10.0}
    assert waits["overall"]["count"] == 4
    assert waits["overall"]["p50_seconds"] == pytest.approx(2.5)
    assert collect_wait_times(conn, 6.0)["channels"]["old"]["count"] == 1
