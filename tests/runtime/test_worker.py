"""The worker runtime, in-process: handlers, retries, timeouts, cancellation, transactions, shutdown.

Each test runs a real Worker (its own threads and connections) against the test database and waits
for conditions in the database, never for fixed times.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import cli
from fairqueue.errors import ConfigurationError
from fairqueue.metrics import Metrics
from fairqueue.worker import EXIT_ABORTED, EXIT_OK, Worker, WorkerConfig
from tests import worker_tasks as t
from tests.conftest import Connections
from tests.helpers import Records, assert_consistent, count, end_workers, wait_for

Starter = Callable[..., Worker]


def status(conn: psycopg.Connection[Any], job_id: int) -> str:
    info = fairqueue.get_job(conn, job_id)
    assert info is not None
    return info.status


def finished(conn: psycopg.Connection[Any], job_id: int, timeout: float = 20.0) -> fairqueue.JobInfo:
    def done() -> fairqueue.JobInfo | None:
        info = fairqueue.get_job(conn, job_id)
        return info if info is not None and info.finished else None

    result: fairqueue.JobInfo = wait_for(done, timeout, f"job {job_id} to finish")
    return result


@pytest.fixture
def effects(conn: psycopg.Connection[Any]) -> None:
    conn.execute(t.CREATE_EFFECTS)
    conn.execute(f"TRUNCATE {t.EFFECTS_TABLE}")


@pytest.fixture
def start_worker(db_url: str) -> Iterator[Starter]:
    running: list[tuple[Worker, threading.Thread]] = []

    def start(**overrides: Any) -> Worker:
        options: dict[str, Any] = {"concurrency": 4, "poll_interval": 0.2, "lease": 5.0} | overrides
        worker = Worker(WorkerConfig(database_url=db_url, **options))
        worker.exit_code = None  # type: ignore[attr-defined]

        def run() -> None:
            worker.exit_code = worker.run()  # type: ignore[attr-defined]

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        running.append((worker, thread))
        wait_for(lambda: worker.worker_id, what="the worker to register")
        return worker

    yield start
    end_workers(running)


def stop_and_wait(worker: Worker, timeout: float = 20.0) -> int:
    worker.stop()
    wait_for(lambda: getattr(worker, "exit_code", None) is not None, timeout, "the worker to exit")
    return int(worker.exit_code)  # type: ignore[attr-defined]


def test_runs_sync_and_async_handlers_and_stores_their_results(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    sync_id = t.add.enqueue(conn, 2, b=3)
    async_id = t.async_add.using(channel="other").enqueue(conn, a=20, b=1)
    start_worker()
    assert finished(conn, sync_id).result == 5
    info = finished(conn, async_id)
    assert (info.status, info.result, info.channel) == ("succeeded", {"sum": 21}, "other")
    assert_consistent(conn)


def test_context_carries_the_job(conn: psycopg.Connection[Any], start_worker: Starter) -> None:
    job_id = t.context.using(channel="tenant-7").enqueue(conn)
    start_worker()
    assert finished(conn, job_id).result == {
        "job_id": job_id,
        "attempt": 1,
        "channel": "tenant-7",
        "kind": "t.context",
        "fair_key": None,
    }


def test_context_carries_the_fair_key_on_every_attempt(conn: psycopg.Connection[Any], start_worker: Starter) -> None:
    retried = t.keyed_context.using(channel="tenant-7", fair_key="user-42", priority=3).enqueue(conn, fail_first=True)
    async_id = t.async_context.using(channel="tenant-7", fair_key="user-7").enqueue(conn)
    plain = t.keyed_context.using(channel="tenant-7").enqueue(conn)
    start_worker()
    info = finished(conn, retried)
    assert (info.status, info.attempt) == ("succeeded", 2)
    assert t.CALLS[f"keyed_context:{retried}"] == [
        {"attempt": 1, "channel": "tenant-7", "priority": 3, "fair_key": "user-42"},
        {"attempt": 2, "channel": "tenant-7", "priority": 3, "fair_key": "user-42"},  # a retry keeps it
    ]
    assert finished(conn, async_id).result == {"channel": "tenant-7", "fair_key": "user-7"}
    assert finished(conn, plain).result == {"attempt": 1, "channel": "tenant-7", "priority": 0, "fair_key": None}
    # built without it (as code that makes its own contexts does), a context has no key
    built = fairqueue.JobContext(
        job_id=1,
        kind="k",
        channel="c",
        attempt=1,
        max_attempts=1,
        enqueued_at=info.enqueued_at,
        started_at=info.enqueued_at,
        worker_id=1,
    )
    assert built.fair_key is None


def test_a_failing_handler_is_retried_with_backoff_until_it_succeeds(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    job_id = t.flaky.enqueue(conn, succeed_on=3)
    start_worker()
    info = finished(conn, job_id)
    assert info.status == "succeeded" and info.result == "finally"
    assert [(a.attempt, a.outcome) for a in info.attempts] == [(1, "failed"), (2, "failed"), (3, "succeeded")]
    assert "RuntimeError: failure number 1" in (info.attempts[0].error or "")
    gaps = [b - a for a, b in zip(t.CALLS["flaky"], t.CALLS["flaky"][1:], strict=False)]
    assert all(gap >= 0.025 for gap in gaps), gaps  # at least half the 0.05 s base (jitter)


def test_a_handler_that_finds_its_result_cannot_be_stored_fails_for_good_with_the_cause(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    refused = t.refuses_its_result.enqueue(conn, with_cause=True)
    without_cause = t.refuses_its_result.enqueue(conn, with_cause=False)
    start_worker()
    info = finished(conn, refused)
    assert (info.status, info.attempt) == ("failed", 1)  # not retried, like any result that cannot be stored
    assert (info.error or "").startswith("ValueError: the value is no JSON\n\nTraceback (most recent call last):")
    assert "ResultNotStorable" not in (info.error or "")
    info = finished(conn, without_cause)  # no cause to record: an ordinary failure, retried
    assert (info.status, info.attempt) == ("failed", 3)
    assert (info.error or "").startswith("ResultNotStorable: no cause given")


def test_a_handler_that_hands_over_a_caught_error_has_it_stored_as_caught_and_retried(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    t.REPORTED.clear()
    job_id = t.reports_its_failure.enqueue(conn)
    start_worker()
    info = finished(conn, job_id)
    assert (info.status, info.attempt) == ("failed", 2)  # retried, as for the error itself
    header = "ValueError: the error the handler reported\n\n"
    assert [a.error for a in info.attempts] == [header + text for text in t.REPORTED]  # no frame of the worker's
    assert "HandlerFailed" not in (info.error or "") and len(t.REPORTED) == 2


def test_out_of_attempts_ends_failed_with_the_error_and_traceback(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    job_id = t.always_fails.enqueue(conn)
    start_worker()
    info = finished(conn, job_id)
    assert info.status == "failed" and info.attempt == 2
    assert info.error is not None
    assert info.error.startswith("ValueError: this handler always fails")
    assert "Traceback (most recent call last)" in info.error and "worker_tasks.py" in info.error


def test_unknown_task_and_bad_arguments_fail_the_job_not_the_worker(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    unknown = fairqueue.enqueue(conn, "no.such.task", {"x": 1}, max_attempts=1)
    bad_args = fairqueue.enqueue(conn, "t.add", {"a": 1, "surprise": 2})
    missing = fairqueue.enqueue(conn, "t.add", {})
    bad_result = t.bad_result.enqueue(conn)
    worker = start_worker()
    info = finished(conn, unknown)
    assert info.status == "failed" and "unknown task 'no.such.task'" in (info.error or "")
    info = finished(conn, bad_args)
    assert (info.status, info.attempt) == ("failed", 1)  # not retried: it cannot get better
    assert "bad arguments" in (info.error or "") and "surprise" in (info.error or "")
    assert "missing a required argument: 'a'" in (finished(conn, missing).error or "")
    assert "cannot be stored" in (finished(conn, bad_result).error or "")
    still_working = t.add.enqueue(conn, 1)
    assert finished(conn, still_working).result == 1
    assert worker.exit_code is None  # type: ignore[attr-defined]


def test_a_timeout_stops_a_busy_sync_handler_and_frees_its_slot(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    spinning = t.spin.enqueue(conn)
    start_worker(concurrency=1)
    info = finished(conn, spinning)
    assert info.status == "timed_out" and "timed out after 0.3 s" in (info.error or "")
    after = t.add.enqueue(conn, 7)
    assert finished(conn, after).result == 7  # the only slot works again


def test_a_timeout_cancels_an_async_handler(conn: psycopg.Connection[Any], start_worker: Starter) -> None:
    job_id = t.async_sleep.enqueue(conn, 60)
    start_worker()
    assert finished(conn, job_id).status == "timed_out"


def test_an_async_handlers_own_timeout_error_is_an_ordinary_failure(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    job_id = t.async_own_timeout.enqueue(conn)
    start_worker()
    info = finished(conn, job_id)
    assert info.status == "failed"
    assert (info.error or "").startswith("TimeoutError: the upstream service did not answer")


def test_a_timeout_stops_a_handler_that_swallows_exceptions(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    job_id = t.spin_swallowing.enqueue(conn)
    start_worker(concurrency=2)
    assert finished(conn, job_id).status == "timed_out"
    # the stopped thread really ended: only the two slot threads remain (one of them the replacement)
    wait_for(lambda: slot_threads() == 2, what="the stopped slot thread to exit")


@pytest.mark.parametrize("task", [t.always_too_slow, t.async_always_too_slow], ids=["sync", "async"])
def test_a_job_that_keeps_timing_out_runs_until_it_is_out_of_attempts(
    conn: psycopg.Connection[Any], start_worker: Starter, task: fairqueue.Task[[], None]
) -> None:
    """A timeout is a failed attempt like any other: retried (after the task's backoff) while
    attempts are left, and final only on the last one."""
    job_id = task.enqueue(conn)
    start_worker()
    info = finished(conn, job_id)
    assert info.status == "timed_out"
    assert [(a.attempt, a.outcome, a.final) for a in info.attempts] == [
        (1, "timed_out", False),
        (2, "timed_out", False),
        (3, "timed_out", True),
    ]


@pytest.mark.parametrize("poll_interval", [WorkerConfig.poll_interval, 30.0], ids=["default-poll", "30s-poll"])
def test_a_timeout_fires_on_time_whatever_the_poll_interval(
    conn: psycopg.Connection[Any], start_worker: Starter, poll_interval: float
) -> None:
    """The dispatcher waits for the next running handler's deadline, not only for the next poll: a
    0.3 s timeout ends the attempt after about 0.3 s, not at the next poll. (The other worker tests
    poll every 0.2 s, which would hide a late timeout.)"""
    job_id = t.spin.enqueue(conn)
    start_worker(concurrency=1, poll_interval=poll_interval)
    info = finished(conn, job_id, timeout=60)
    [attempt] = info.attempts
    assert attempt.outcome == "timed_out" and attempt.started_at is not None
    took = (attempt.finished_at - attempt.started_at).total_seconds()
    assert took < 0.3 + min(0.5, poll_interval / 2), f"a 0.3 s timeout ended the attempt after {took:.2f} s"


def slot_threads() -> int:
    return sum(1 for th in threading.enumerate() if th.name.startswith("fairqueue-slot-"))


def test_bad_arguments_raised_inside_a_handler_are_retried_like_any_failure(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    job_id = t.nested_bad_arguments.enqueue(conn)
    start_worker()
    info = finished(conn, job_id)
    assert [(a.attempt, a.outcome) for a in info.attempts] == [(1, "failed"), (2, "failed")]


def test_an_async_job_cancelled_before_it_started_is_recorded_cancelled(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    blocker = t.async_block_loop.enqueue(conn, gate="blocking", release="go")
    start_worker(concurrency=2)
    assert t.GATES["blocking"].wait(20)
    waiting = t.async_add.enqueue(conn, 1)  # claimed, but its coroutine cannot start: the loop is blocked
    wait_for(lambda: status(conn, waiting) == "running", what="the second job to be claimed")
    assert fairqueue.cancel(conn, waiting) == "cancel_requested"
    info = finished(conn, waiting)
    assert info.status == "cancelled" and info.error == "cancelled before it started"
    t.GATES["go"].set()
    assert finished(conn, blocker).status == "succeeded"


def test_a_cancelled_queued_job_never_runs(conn: psycopg.Connection[Any], start_worker: Starter) -> None:
    doomed = t.add.enqueue(conn, 1)
    assert fairqueue.cancel(conn, doomed) == "cancelled"
    other = t.add.enqueue(conn, 2)
    start_worker()
    assert finished(conn, other).result == 2
    info = finished(conn, doomed)
    assert [(a.attempt, a.outcome) for a in info.attempts] == [(0, "cancelled")]


@pytest.mark.parametrize("task", [t.wait_for_cancel, t.async_wait_for_cancel], ids=["sync", "async"])
def test_cancelling_a_running_job_stops_its_handler(
    conn: psycopg.Connection[Any], start_worker: Starter, task: fairqueue.Task[Any, Any]
) -> None:
    job_id = task.enqueue(conn, gate="started")
    start_worker(concurrency=1)
    assert t.GATES["started"].wait(20)
    assert fairqueue.cancel(conn, job_id) == "cancel_requested"
    info = finished(conn, job_id)
    assert info.status == "cancelled"
    after = t.add.enqueue(conn, 3)
    assert finished(conn, after).result == 3  # the slot was given back


def test_a_transactional_handler_commits_its_writes_with_the_completion(
    conn: psycopg.Connection[Any], start_worker: Starter, effects: None
) -> None:
    job_id = t.effect.enqueue(conn)
    start_worker()
    assert finished(conn, job_id).result == job_id
    assert conn.execute(f"SELECT job_id, attempt FROM {t.EFFECTS_TABLE}").fetchall() == [(job_id, 1)]


def test_a_failing_transactional_handler_leaves_none_of_its_writes(
    conn: psycopg.Connection[Any], start_worker: Starter, effects: None
) -> None:
    job_id = t.effect.using(max_attempts=2).enqueue(conn, fail=True)
    start_worker()
    info = finished(conn, job_id)
    assert (info.status, info.attempt) == ("failed", 2)
    assert count_effects(conn) == 0


def test_an_async_transactional_handler_commits_or_rolls_back_with_its_job(
    conn: psycopg.Connection[Any], start_worker: Starter, effects: None
) -> None:
    ok = t.async_effect.enqueue(conn)
    failing = t.async_effect.enqueue(conn, fail=True)
    start_worker()
    assert finished(conn, ok).result == ok
    info = finished(conn, failing)
    assert (info.status, info.attempt) == ("failed", 2)
    assert conn.execute(f"SELECT job_id, attempt, note FROM {t.EFFECTS_TABLE}").fetchall() == [(ok, 1, "async")]


def count_effects(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(f"SELECT count(*) FROM {t.EFFECTS_TABLE}").fetchone()
    assert row is not None
    return int(row[0])


def test_a_handler_whose_job_was_taken_away_does_not_commit(
    conn: psycopg.Connection[Any], start_worker: Starter, effects: None
) -> None:
    """Exactly once for database effects: a lease expires mid-run, the job is re-run elsewhere, and
    the first run's transaction (already written, not yet committed) must roll back."""
    job_id = t.effect_then_wait.enqueue(conn, gate="running", release="go")
    worker = start_worker(maintenance=False)
    assert t.GATES["running"].wait(20)
    first_worker = worker.worker_id
    conn.execute(
        "UPDATE fairqueue.worker SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (first_worker,)
    )
    assert fairqueue.recover_expired_workers(conn) == 1
    t.GATES["go"].set()  # the first run finishes now: its completion must find the job gone
    info = finished(conn, job_id)
    assert info.status == "succeeded"
    assert [(a.attempt, a.outcome) for a in info.attempts] == [(1, "lost"), (2, "succeeded")]
    assert conn.execute(f"SELECT job_id, attempt FROM {t.EFFECTS_TABLE}").fetchall() == [(job_id, 2)]


def test_graceful_stop_lets_the_running_job_finish(conn: psycopg.Connection[Any], start_worker: Starter) -> None:
    job_id = t.hold.enqueue(conn, gate="running", release="go")
    worker = start_worker()
    assert t.GATES["running"].wait(20)
    worker.stop()
    queued_after_stop = t.add.enqueue(conn, 1)
    t.GATES["go"].set()
    assert stop_and_wait(worker) == EXIT_OK
    assert finished(conn, job_id).result == "released"
    assert status(conn, queued_after_stop) == "ready"  # a stopping worker claims nothing new
    assert count(conn, "worker") == 0


def test_past_the_grace_period_running_jobs_are_given_back(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    job_id = t.hold.using(max_attempts=3).enqueue(conn, gate="running", release="never")
    worker = start_worker(grace=0.2)
    assert t.GATES["running"].wait(20)
    assert stop_and_wait(worker) == EXIT_ABORTED
    info = fairqueue.get_job(conn, job_id)
    assert info is not None and info.status in ("scheduled", "ready")  # due now: the next claim takes it
    assert [(a.attempt, a.outcome) for a in info.attempts] == [(1, "lost")]
    assert count(conn, "worker") == 0


def test_jobs_of_a_worker_whose_lease_expired_run_again_within_seconds(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    job_id = t.add.enqueue(conn, 40, 2)
    dead = fairqueue.register_worker(conn, "dies-silently", lease_seconds=0.5)
    [claimed] = fairqueue.claim_batch(conn, dead, 1)
    assert claimed.id == job_id
    began = time.monotonic()
    start_worker(maintenance_interval=0.2)
    info = finished(conn, job_id)
    assert time.monotonic() - began < 5
    assert [(a.attempt, a.outcome) for a in info.attempts] == [(1, "lost"), (2, "succeeded")]
    assert count(conn, "worker") == 1  # the dead worker's row was pruned


def test_exactly_one_worker_holds_the_maintenance_role(conn: psycopg.Connection[Any], start_worker: Starter) -> None:
    workers = [start_worker(maintenance_interval=0.1) for _ in range(3)]
    wait_for(lambda: sum(w.is_maintainer for w in workers) == 1, what="one maintainer")
    holders = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1718681602 AND granted"
    ).fetchone()
    assert holders == (1,)
    leader = next(w for w in workers if w.is_maintainer)
    assert stop_and_wait(leader) == EXIT_OK
    rest = [w for w in workers if w is not leader]
    wait_for(lambda: sum(w.is_maintainer for w in rest) == 1, what="another worker to take the role")


def _dead_rows(conn: psycopg.Connection[Any], jobs: int) -> None:
    """Leaves ``jobs`` dead rows in job and in running_job, and makes the statistics show them."""
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec("t.add", {"a": 1, "b": 2}) for _ in range(jobs)])
    conn.execute("DELETE FROM fairqueue.running_job")
    conn.execute("DELETE FROM fairqueue.job")
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")  # the end of this transaction flushes this session's counters


def _vacuums(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT relname, vacuum_count FROM pg_stat_user_tables WHERE schemaname = 'fairqueue' "
        "AND relname IN ('job', 'running_job')"
    ).fetchall()
    return dict(rows)


def test_the_maintainer_vacuums_hot_tables_full_of_dead_rows(conn: psycopg.Connection[Any]) -> None:
    """Autovacuum comes at most once a minute; at thousands of jobs/s the hot tables would grow to
    hold a minute of dead rows. The maintainer vacuums them when dead rows pile up, and only then."""
    from fairqueue.maintenance import Maintainer

    maintainer = Maintainer(vacuum_every=0)
    before = _vacuums(conn)
    assert maintainer.tick(conn).vacuumed == ()  # nothing dead yet
    _dead_rows(conn, 3_000)
    assert sorted(maintainer.tick(conn).vacuumed) == ["job", "running_job"]
    assert all(count > before[name] for name, count in _vacuums(conn).items())
    assert maintainer.tick(conn).vacuumed == ()  # they are clean now


def test_a_failing_chore_does_not_keep_the_other_chores_from_running(conn: psycopg.Connection[Any]) -> None:
    """Lease recovery fails on every tick here; due jobs are still promoted and the tables vacuumed,
    and the failure is raised once they have had their turn (the worker then gives up the role)."""
    from fairqueue.maintenance import Maintainer

    conn.execute(
        """
        CREATE OR REPLACE FUNCTION public.test_keep_workers() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'the test keeps worker rows'; END $$;
        CREATE OR REPLACE TRIGGER test_keep_workers BEFORE DELETE ON fairqueue.worker
            FOR EACH ROW WHEN (OLD.name = 'expired') EXECUTE FUNCTION public.test_keep_workers();
        """
    )
    try:
        _dead_rows(conn, 3_000)
        fairqueue.register_worker(conn, "expired", lease_seconds=0.001)
        delayed = t.add.using(delay=3600).enqueue(conn, 1, 2)
        conn.execute("UPDATE fairqueue.scheduled_job SET run_at = now() - interval '1 second'")
        vacuums = _vacuums(conn)
        with pytest.raises(psycopg.Error, match="the test keeps worker rows"):
            Maintainer(vacuum_every=0).tick(conn)
        assert conn.execute("SELECT job_id FROM fairqueue.running_job").fetchall() == [(delayed,)]  # promoted
        assert all(n > vacuums[name] for name, n in _vacuums(conn).items())  # vacuumed
    finally:
        conn.execute("DROP TRIGGER IF EXISTS test_keep_workers ON fairqueue.worker")
        conn.execute("DROP FUNCTION IF EXISTS public.test_keep_workers()")


def test_a_role_that_may_not_vacuum_leaves_it_to_autovacuum(
    conn: psycopg.Connection[Any], db_url: str, connect: Any
) -> None:
    from fairqueue.maintenance import vacuum_hot_tables
    from tests.helpers import as_role

    name = f"fq_novacuum_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    conn.execute(f'DROP ROLE IF EXISTS "{name}"')
    conn.execute(f"CREATE ROLE \"{name}\" LOGIN PASSWORD 'not-a-secret'")
    try:
        assert cli.main(["grant", "worker", name, "--database-url", db_url]) == 0
        _dead_rows(conn, 3_000)
        with psycopg.connect(as_role(db_url, name), autocommit=True) as worker_conn:
            assert vacuum_hot_tables(worker_conn) == []  # no VACUUM attempted (it would only warn)
        assert vacuum_hot_tables(conn) != []  # the owner does vacuum
        if conn.info.server_version >= 170000:  # docs/operations.md: GRANT MAINTAIN lets the role vacuum
            conn.execute(f'GRANT MAINTAIN ON fairqueue.job, fairqueue.running_job TO "{name}"')
            _dead_rows(conn, 3_000)
            with psycopg.connect(as_role(db_url, name), autocommit=True) as worker_conn:
                assert sorted(vacuum_hot_tables(worker_conn)) == ["job", "running_job"]
    finally:
        conn.execute(f'DROP OWNED BY "{name}"')
        conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def test_notifications_still_arrive_after_the_listener_connection_is_killed(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    start_worker(poll_interval=60)  # only a notification can wake it in time
    first = t.add.enqueue(conn, 1)
    assert finished(conn, first, timeout=20).result == 1
    [(killed,)] = conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'fairqueue listener'"
    ).fetchall()
    assert killed == 1
    wait_for(
        lambda: conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'fairqueue listener' AND query LIKE 'LISTEN%%'"
        ).fetchone(),
        what="a new listener",
    )
    second = t.add.enqueue(conn, 2)
    assert finished(conn, second, timeout=20).result == 2


def test_killed_dispatcher_connection_loses_no_job(conn: psycopg.Connection[Any], start_worker: Starter) -> None:
    ids = [t.sleep_ms.enqueue(conn, 1) for _ in range(300)]
    start_worker()
    wait_for(lambda: count(conn, "job") < 250, what="the worker to get going")
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'fairqueue dispatcher'"
    )
    for job_id in ids:
        assert finished(conn, job_id).status == "succeeded"
    assert_consistent(conn)


def test_an_idle_worker_wakes_when_a_rate_limited_channel_may_run_again(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    fairqueue.configure_channel(conn, "limited", rate_limit="20/s")
    ids = [t.add.using(channel="limited").enqueue(conn, i) for i in range(10)]
    began = time.monotonic()
    start_worker(poll_interval=30)
    for job_id in ids:
        finished(conn, job_id)
    assert time.monotonic() - began < 5  # ~0.5 s at 20/s; polling alone would take minutes


def test_metrics_count_claims_and_outcomes_per_channel(conn: psycopg.Connection[Any], start_worker: Starter) -> None:
    ok = t.add.using(channel="m").enqueue(conn, 1)
    bad = t.always_fails.using(channel="m", max_attempts=1).enqueue(conn)
    worker = start_worker()
    finished(conn, ok)
    finished(conn, bad)

    def rendered() -> str | None:
        text = worker.metrics.render()
        return text if 'outcome="failed"' in text else None

    text = wait_for(rendered, what="metrics to be recorded")
    assert 'fairqueue_jobs_finished_total{channel="m",kind="t.add",outcome="succeeded"} 1' in text
    assert 'fairqueue_jobs_finished_total{channel="m",kind="t.always_fails",outcome="failed"} 1' in text
    assert 'fairqueue_jobs_claimed_total{channel="m",kind="t.add"} 1' in text


def test_a_worker_refuses_a_database_without_fairqueue(empty_database_url: str) -> None:
    with pytest.raises(ConfigurationError, match="run `fairqueue migrate` first"):
        Worker(WorkerConfig(database_url=empty_database_url)).run()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("concurrency", 0, "concurrency must be"),
        ("batch", 5000, "batch must be"),
        ("lease", 0, "lease must be"),
        ("grace", -1, "grace must be"),
        ("grace", float("nan"), "grace must be zero or more seconds and at most 86400"),
        ("lease", float("inf"), "lease must be more than zero seconds and at most 86400"),
        ("lease", 1e300, "lease must be"),
        ("poll_interval", float("inf"), "poll_interval must be more than zero seconds and at most 3600"),
        ("maintenance_interval", float("nan"), "maintenance_interval must be"),
        ("reconnect_max", 1e9, "reconnect_max must be"),
        ("partition_days_ahead", 10**6, "partition_days_ahead must be"),
        ("name", "bad\x00name", "worker name must not contain NUL"),
        ("name", "\ud800", "worker name must be valid Unicode"),
    ],
)
def test_bad_worker_settings_are_refused(option: str, value: object, message: str) -> None:
    config = WorkerConfig(database_url="postgresql://localhost/x")
    setattr(config, option, value)
    with pytest.raises(ConfigurationError, match=message):
        config.check()


# -- outcomes PostgreSQL refuses --------------------------------------------------------------------


@pytest.mark.parametrize("what", ["nul", "surrogate", "both"])
def test_an_error_text_postgresql_cannot_store_fails_its_job_and_not_the_batch(
    conn: psycopg.Connection[Any], start_worker: Starter, what: str
) -> None:
    t.BARRIERS["end"] = threading.Barrier(4)
    bad = t.bad_text.enqueue(conn, what, barrier="end")
    good = [t.meet.enqueue(conn, n, barrier="end") for n in range(3)]
    worker = start_worker(concurrency=4)
    info = finished(conn, bad)
    assert info.status == "failed"
    expected = {"nul": "ValueError: bad \\0 text", "surrogate": "ValueError: bad \\ud800 text"}
    expected["both"] = "ValueError: \\0\\udcff\\0"
    assert (info.error or "").startswith(expected[what])
    assert [finished(conn, job_id).result for job_id in good] == [0, 1, 2]
    later = t.add.enqueue(conn, 5)
    assert finished(conn, later).result == 5
    assert worker.exit_code is None  # type: ignore[attr-defined]
    assert stop_and_wait(worker) == EXIT_OK
    assert count(conn, "worker") == 0
    assert_consistent(conn)


@pytest.mark.parametrize("what", ["nul", "surrogate"])
def test_a_result_postgresql_cannot_store_fails_its_job_and_not_the_batch(
    conn: psycopg.Connection[Any], start_worker: Starter, what: str
) -> None:
    t.BARRIERS["end"] = threading.Barrier(3)
    bad = t.bad_text.enqueue(conn, what, barrier="end", where="result")
    good = [t.meet.enqueue(conn, n, barrier="end") for n in range(2)]
    worker = start_worker(concurrency=3)
    info = finished(conn, bad)
    assert info.status == "failed"
    assert (info.error or "").startswith("the handler's return value cannot be stored: result contains")
    assert [finished(conn, job_id).result for job_id in good] == [0, 1]
    assert stop_and_wait(worker) == EXIT_OK


REFUSE = """
CREATE OR REPLACE FUNCTION public.test_refuse_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.error LIKE %s THEN
        RAISE EXCEPTION 'the test refuses this outcome';
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER test_refuse_outcome BEFORE INSERT ON fairqueue.completed_job
    FOR EACH ROW EXECUTE FUNCTION public.test_refuse_outcome();
"""


@pytest.fixture
def refuse_outcomes(conn: psycopg.Connection[Any]) -> Iterator[Callable[[str], None]]:
    """Makes the database refuse to record outcomes whose error text is LIKE a pattern (a real
    error inside fairqueue.finish, as a constraint or a full disk would raise)."""

    def refuse(pattern: str) -> None:
        conn.execute(REFUSE.replace("%s", "'" + pattern.replace("'", "''") + "'"))

    yield refuse
    stop_refusing(conn)
    conn.execute("DROP FUNCTION IF EXISTS public.test_refuse_outcome()")


def stop_refusing(conn: psycopg.Connection[Any]) -> None:
    """Drops the refusing trigger. Dropping a trigger of the partitioned history locks the table and
    then each partition, while a running worker's finish may lock them the other way round: when
    PostgreSQL breaks that deadlock by cancelling the drop, drop again."""
    while True:
        try:
            conn.execute("DROP TRIGGER IF EXISTS test_refuse_outcome ON fairqueue.completed_job")
            return
        except psycopg.errors.DeadlockDetected:
            continue


def test_an_outcome_the_database_refuses_is_replaced_by_a_failure_saying_why(
    conn: psycopg.Connection[Any], start_worker: Starter, refuse_outcomes: Callable[[str], None]
) -> None:
    refuse_outcomes("ValueError: poison%")
    t.BARRIERS["end"] = threading.Barrier(4)
    bad = t.bad_text.enqueue(conn, "poison", barrier="end")
    good = [t.meet.enqueue(conn, n, barrier="end") for n in range(3)]
    worker = start_worker(concurrency=4)
    info = finished(conn, bad)
    assert info.status == "failed"
    assert info.error == "the outcome could not be stored: the test refuses this outcome"
    assert [finished(conn, job_id).result for job_id in good] == [0, 1, 2]
    assert worker.exit_code is None  # type: ignore[attr-defined]


def test_a_worker_holds_no_more_than_its_concurrency_and_one_batch_while_outcomes_wait_to_be_recorded(
    conn: psycopg.Connection[Any], start_worker: Starter, refuse_outcomes: Callable[[str], None], worker_log: Records
) -> None:
    """Outcomes are recorded while the next batch is claimed, so a worker may hold one batch more
    than --concurrency; while its outcomes cannot be recorded at all it claims nothing beyond that."""
    refuse_outcomes("%")  # every outcome, and the failures that would replace them: nothing is recorded
    ids = [t.always_fails.using(max_attempts=1).enqueue(conn) for _ in range(8)]
    start_worker(concurrency=2)
    held = "SELECT count(*) FROM fairqueue.running_job WHERE worker_id IS NOT NULL"
    wait_for(lambda: conn.execute(held).fetchone() == (4,), what="2 slots and one batch of 2 awaiting recording")
    tries = worker_log.count("could not record a batch of outcomes; recording them one by one")
    # two more tries at recording: between them the dispatcher went round its loop, where it would
    # have claimed again had it counted the unrecorded jobs' slots as free
    wait_for(
        lambda: worker_log.count("could not record a batch of outcomes; recording them one by one") >= tries + 2,
        what="two more failed recordings",
    )
    assert conn.execute(held).fetchone() == (4,)
    assert count(conn, "completed_job") == 0
    stop_refusing(conn)
    # a job whose outcome was refused just before the drop gets the substitute failure recorded after it
    errors = ("ValueError: this handler always fails", "the outcome could not be stored: the test refuses")
    for job_id in ids:
        info = finished(conn, job_id)
        assert info.status == "failed" and (info.error or "").startswith(errors), info.error


class FailingMetrics(Metrics):
    def claim_round_trip(self, seconds: float, jobs: int) -> None:
        raise RuntimeError("a bug in the runtime")


class FailingFinishMetrics(Metrics):
    def jobs_finished(self, done: Any) -> None:
        raise RuntimeError("a bug in the runtime")


def test_an_unexpected_error_in_the_finisher_stops_the_worker_and_records_each_outcome_once(
    conn: psycopg.Connection[Any], db_url: str, worker_log: Records
) -> None:
    job_id = t.add.enqueue(conn, 1, 2)
    worker = Worker(WorkerConfig(database_url=db_url, concurrency=2, poll_interval=0.2), metrics=FailingFinishMetrics())
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    runner.join(30)
    assert not runner.is_alive(), "the worker kept running without its finisher"
    assert worker_log.count("the finisher failed; aborting (running jobs will be re-run)") == 1
    assert count(conn, "worker") == 0
    info = finished(conn, job_id)
    assert info.result == 3 and [a.outcome for a in info.attempts] == ["succeeded"]


def test_an_unexpected_error_in_the_dispatcher_is_logged_and_the_worker_deregisters(
    conn: psycopg.Connection[Any], db_url: str, worker_log: Records
) -> None:
    t.add.enqueue(conn, 1)
    worker = Worker(WorkerConfig(database_url=db_url, concurrency=2, poll_interval=0.2), metrics=FailingMetrics())
    assert worker.run() == EXIT_ABORTED
    assert worker_log.count("the dispatcher failed; aborting (running jobs will be re-run)") == 1
    assert count(conn, "worker") == 0
    assert_consistent(conn)


@contextlib.contextmanager
def broken_around_job() -> Iterator[None]:
    raise RuntimeError("around_job could not set up")
    yield  # pragma: no cover


def test_a_failure_around_a_job_fails_the_job_and_frees_its_slot(db_url: str, conn: psycopg.Connection[Any]) -> None:
    ids = [t.add.enqueue(conn, n) for n in range(3)]
    worker = Worker(WorkerConfig(database_url=db_url, concurrency=1, poll_interval=0.2), around_job=broken_around_job)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        for job_id in ids:  # one slot: each job must give it back for the next one to run
            info = finished(conn, job_id)
            assert info.status == "failed" and "around_job could not set up" in (info.error or "")
    finally:
        worker.stop()
        thread.join(20)


def test_a_failing_claim_logs_the_database_message_without_its_context(
    conn: psycopg.Connection[Any], start_worker: Starter, worker_log: Records
) -> None:
    # a channel row no fairqueue call writes any more: a rate whose wait overflows an interval
    fairqueue.configure_channel(conn, "broken", rate_limit="1/s")
    conn.execute(
        "UPDATE fairqueue.channel SET rate_per_second = 1e-15, tokens = 0, throttled_until = NULL WHERE name = 'broken'"
    )
    t.add.using(channel="broken").enqueue(conn, 1)
    start_worker()
    wait_for(lambda: worker_log.count("claim failed; retrying shortly"), what="a failed claim")
    record = next(r for r in worker_log.records if r.getMessage() == "claim failed; retrying shortly")
    # the primary message alone (PostgreSQL 18 says interval, 15 says timestamp), no CONTEXT lines
    assert record.error in ("interval out of range", "timestamp out of range")  # type: ignore[attr-defined]


def test_an_error_of_the_maintenance_role_is_logged_on_one_line(
    conn: psycopg.Connection[Any], start_worker: Starter, worker_log: Records
) -> None:
    # an error raised inside a fairqueue function comes with CONTEXT lines
    conn.execute(
        """
        CREATE OR REPLACE FUNCTION public.test_keep_workers() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'the test keeps worker rows' USING DETAIL = E'line one\n\tline two';
        END $$;
        CREATE OR REPLACE TRIGGER test_keep_workers BEFORE DELETE ON fairqueue.worker
            FOR EACH ROW WHEN (OLD.name = 'expired') EXECUTE FUNCTION public.test_keep_workers();
        """
    )
    try:
        fairqueue.register_worker(conn, "expired", lease_seconds=0.001)
        start_worker(maintenance_interval=0.1)
        message = "lost the maintenance role with its connection"
        wait_for(lambda: worker_log.count(message), what="the failed chore to be logged")
        record: Any = next(r for r in worker_log.records if r.getMessage() == message)
        assert record.error == "the test keeps worker rows"
    finally:
        conn.execute("DROP TRIGGER IF EXISTS test_keep_workers ON fairqueue.worker")
        conn.execute("DROP FUNCTION IF EXISTS public.test_keep_workers()")


def test_an_outcome_is_recorded_promptly_while_other_slots_stay_busy(
    conn: psycopg.Connection[Any], start_worker: Starter
) -> None:
    holds = [t.hold.enqueue(conn, gate=f"running-{i}", release="go") for i in range(9)]
    start_worker(concurrency=10, poll_interval=30)  # nothing but the freed slot's short linger may delay it
    for i in range(9):
        assert t.GATES[f"running-{i}"].wait(20)
    quick = t.add.enqueue(conn, 2, 3)
    began = time.monotonic()
    assert finished(conn, quick, timeout=10).result == 5
    assert time.monotonic() - began < 5
    t.GATES["go"].set()
    for job_id in holds:
        assert finished(conn, job_id).status == "succeeded"


def test_a_job_enqueued_while_a_producer_kept_its_channel_active_is_claimed_without_a_notification(
    conn: psycopg.Connection[Any], connect: Connections, start_worker: Starter
) -> None:
    """The case producers' notifications used to cover: a claim finds a channel empty but cannot idle
    it, because a producer is adding a job to it (and, seeing it active, will not notify). The
    worker claims again in milliseconds while a channel is eligible, not at the next poll."""
    first, second = t.add.enqueue(conn, 1), t.add.enqueue(conn, 2)  # channel "default"
    me = fairqueue.register_worker(conn)
    [held] = fairqueue.claim_batch(conn, me, 1)  # "default" active, one job left
    producer = connect(autocommit=False)
    late = t.add.enqueue(producer, 3)  # the channel is active: no wakeup, no notification
    start_worker(poll_interval=60)  # only claiming again soon can get the late job started in time
    assert finished(conn, second if held.id == first else first).result in (1, 2)
    # that claim found the channel empty and could not idle it (the producer's lock): still active
    assert conn.execute("SELECT active FROM fairqueue.channel WHERE name = 'default'").fetchone() == (True,)
    producer.commit()
    started = time.monotonic()
    assert finished(conn, late, timeout=10).result == 3
    assert time.monotonic() - started < 5  # not the 60 s poll
    fairqueue.complete(conn, me, held.id)


# Runs in a process of its own: the signal is sent while the main thread holds the lock of the
# dispatcher's wake-up event, as it does for a moment inside every ``wake.clear()`` and ``wake.wait()``.
_SIGNAL_UNDER_THE_WAKE_LOCK = """
import os, signal, sys
from fairqueue.worker import Worker, WorkerConfig

worker = Worker(WorkerConfig(database_url=sys.argv[1]))
worker.install_signal_handlers()
lifecycle = worker._lifecycle
with lifecycle.wake._cond:
    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in this thread, before the lock is let go
    sum(range(1000))
stopped = lifecycle.stopping.wait(20) and lifecycle.wake.wait(20)
with lifecycle.wake._cond:
    os.kill(os.getpid(), signal.SIGINT)  # the second signal aborts
    sum(range(1000))
aborted = lifecycle.aborted.wait(20)
print("stopped" if stopped else "not stopped", "aborted" if aborted else "not aborted", flush=True)
"""


def test_a_signal_arriving_while_the_dispatcher_holds_its_wake_lock_still_stops_the_worker(db_url: str) -> None:
    """SIGTERM stops the worker and a second signal aborts it, whatever the main thread (the dispatcher)
    holds when the signal arrives. The handler runs in the main thread; one that stopped the worker
    itself would take the wake-up event's lock, which the dispatcher holds inside ``wake.clear()``:
    the worker hung for good, with its listener blocked behind the same lock (seen in CI, where the
    unread notifications then held up a DROP DATABASE)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _SIGNAL_UNDER_THE_WAKE_LOCK, db_url],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the worker hung in its signal handler")
    assert done.stdout.strip() == "stopped aborted", done.stdout + done.stderr
