"""Invariants 7 and 8: at-least-once with every attempt recorded, exactly-once inside the database,
and no job lost or silently dropped."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import fairqueue
from tests.conftest import Connections
from tests.helpers import assert_consistent, count


def _expire(conn: psycopg.Connection[Any], worker_id: int) -> None:
    """What the passing of time does to a worker that stopped heartbeating."""
    conn.execute(
        "UPDATE fairqueue.worker SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (worker_id,)
    )


def _make_due(conn: psycopg.Connection[Any]) -> None:
    """What the passing of time does to scheduled jobs."""
    conn.execute("UPDATE fairqueue.scheduled_job SET run_at = now() - interval '1 second'")


def test_success_stores_the_result(conn: psycopg.Connection[Any], worker: int) -> None:
    job_id = fairqueue.enqueue(conn, "add", {"a": 1, "b": 2})
    [job] = fairqueue.claim_batch(conn, worker, 1)
    assert fairqueue.complete(conn, worker, job.id, {"sum": 3})
    info = fairqueue.get_job(conn, job_id)
    assert info is not None
    assert (info.status, info.result, info.attempt, info.args) == ("succeeded", {"sum": 3}, 1, {"a": 1, "b": 2})
    assert count(conn, "job") == 0 and count(conn, "running_job") == 0
    assert_consistent(conn)


def test_failure_with_retry_runs_again_and_records_every_attempt(conn: psycopg.Connection[Any], worker: int) -> None:
    job_id = fairqueue.enqueue(conn, "flaky", max_attempts=3)
    for attempt in (1, 2):
        [job] = fairqueue.claim_batch(conn, worker, 1)
        assert job.attempt == attempt
        done = fairqueue.fail(conn, worker, job.id, f"boom {attempt}", retry_in=30)
        assert done is not None and not done.final and done.retry_at is not None
        assert fairqueue.claim_batch(conn, worker, 1) == []  # backing off
        _make_due(conn)
    [job] = fairqueue.claim_batch(conn, worker, 1)
    assert job.attempt == 3
    done = fairqueue.fail(conn, worker, job.id, "boom 3", retry_in=30)
    assert done is not None and done.final  # out of attempts: retry_in is ignored
    info = fairqueue.get_job(conn, job_id)
    assert info is not None and info.status == "failed" and info.error == "boom 3"
    assert [(a.attempt, a.outcome, a.final, a.error) for a in info.attempts] == [
        (1, "failed", False, "boom 1"),
        (2, "failed", False, "boom 2"),
        (3, "failed", True, "boom 3"),
    ]
    assert_consistent(conn)


def test_failure_without_retry_is_final(conn: psycopg.Connection[Any], worker: int) -> None:
    job_id = fairqueue.enqueue(conn, "k", max_attempts=5)
    [job] = fairqueue.claim_batch(conn, worker, 1)
    fairqueue.fail(conn, worker, job.id, "unknown task 'k'")
    info = fairqueue.get_job(conn, job_id)
    assert info is not None and (info.status, info.error) == ("failed", "unknown task 'k'")


def test_batched_finish_in_one_call(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": f"c{i % 4}"} for i in range(100)])
    jobs = fairqueue.claim_batch(conn, worker, 100)
    outcomes = [
        fairqueue.Outcome(j.id, "succeeded" if j.id % 2 else "failed", result=j.id, error="x", retry_in=0) for j in jobs
    ]
    finished = fairqueue.finish(conn, worker, outcomes)
    assert len(finished) == 100
    assert sum(f.final for f in finished) == 50
    assert count(conn, "scheduled_job") == 50
    assert_consistent(conn)


def test_a_batched_finish_gives_each_job_its_own_outcome_error_result_and_retry(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    """finish matches each job to its own entry of every array, in any order of the batch."""
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": f"c{i % 3}"} for i in range(12)])
    jobs = fairqueue.claim_batch(conn, worker, 12)
    outcomes = [
        fairqueue.Outcome(
            j.id,
            "succeeded" if i % 3 == 0 else "failed",
            result={"n": i} if i % 3 == 0 else None,
            error=None if i % 3 == 0 else f"error {i}",
            retry_in=None if i % 3 != 1 else 100.0 + i,  # every third failure retries, the others are final
        )
        for i, j in enumerate(jobs)
    ]
    finished = {f.job_id: f for f in fairqueue.finish(conn, worker, list(reversed(outcomes)))}
    for i, j in enumerate(jobs):
        f = finished[j.id]
        if i % 3 == 1:
            assert f.retry_at is not None and not f.final
            assert conn.execute(
                "SELECT round(extract(epoch FROM s.run_at - c.finished_at)) FROM fairqueue.scheduled_job s "
                "JOIN fairqueue.completed_job c ON c.job_id = s.job_id WHERE s.job_id = %s",
                (j.id,),
            ).fetchone() == (100 + i,)
        else:
            assert f.final and f.retry_at is None
        info = fairqueue.get_job(conn, j.id)
        assert info is not None
        assert info.attempts[-1].outcome == ("succeeded" if i % 3 == 0 else "failed")
        assert info.attempts[-1].error == (None if i % 3 == 0 else f"error {i}")
        assert info.result == ({"n": i} if i % 3 == 0 else None)
    assert_consistent(conn)


def test_another_workers_finish_is_ignored(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue(conn, "k")
    [job] = fairqueue.claim_batch(conn, worker, 1)
    intruder = fairqueue.register_worker(conn)
    assert fairqueue.finish(conn, intruder, [fairqueue.Outcome(job.id)]) == []
    assert fairqueue.complete(conn, worker, job.id)


def test_release_gives_the_job_back_without_using_an_attempt(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_channel(conn, "bob", max_concurrency=1)
    fairqueue.enqueue(conn, "k", channel="bob")
    [job] = fairqueue.claim_batch(conn, worker, 1)
    assert fairqueue.release(conn, worker, [job.id]) == 1
    [again] = fairqueue.claim_batch(conn, worker, 1)
    assert (again.id, again.attempt) == (job.id, 1)
    assert_consistent(conn)


def test_dead_workers_jobs_run_again_with_the_next_attempt(conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_channel(conn, "bob", max_concurrency=2)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 3)
    dead = fairqueue.register_worker(conn, "dies")
    lost = fairqueue.claim_batch(conn, dead, 10)
    assert len(lost) == 2
    _expire(conn, dead)
    assert fairqueue.recover_expired_workers(conn) == 2
    survivor = fairqueue.register_worker(conn, "lives")
    rerun = fairqueue.claim_batch(conn, survivor, 10)
    assert sorted(j.id for j in rerun) == sorted(j.id for j in lost)  # the cap still holds: 2
    assert all(j.attempt == 2 for j in rerun)
    # the dead worker comes back: its results are refused, it may not claim, its heartbeat says so
    assert fairqueue.finish(conn, dead, [fairqueue.Outcome(j.id) for j in lost]) == []
    assert not fairqueue.heartbeat(conn, dead)
    with pytest.raises(fairqueue.UnknownWorkerError, match="not registered or its lease has expired"):
        fairqueue.claim_batch(conn, dead, 1)
    info = fairqueue.get_job(conn, lost[0].id)
    assert info is not None and [(a.attempt, a.outcome) for a in info.attempts] == [(1, "lost")]
    assert "lease expired" in (info.attempts[0].error or "")
    assert_consistent(conn)


def test_lost_job_out_of_attempts_fails_for_good(conn: psycopg.Connection[Any]) -> None:
    job_id = fairqueue.enqueue(conn, "k", max_attempts=1)
    dead = fairqueue.register_worker(conn)
    fairqueue.claim_batch(conn, dead, 1)
    _expire(conn, dead)
    fairqueue.recover_expired_workers(conn)
    info = fairqueue.get_job(conn, job_id)
    assert info is not None and info.status == "lost"


def test_deregister_hands_running_jobs_back(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue(conn, "k")
    fairqueue.claim_batch(conn, worker, 1)
    assert fairqueue.deregister_worker(conn, worker) == 1
    other = fairqueue.register_worker(conn)
    assert [j.attempt for j in fairqueue.claim_batch(conn, other, 1)] == [2]


def test_heartbeat_extends_the_lease(conn: psycopg.Connection[Any], worker: int) -> None:
    assert fairqueue.heartbeat(conn, worker, lease_seconds=600)
    row = conn.execute("SELECT lease_expires_at > now() + interval '9 minutes' FROM fairqueue.worker").fetchone()
    assert row == (True,)


@pytest.mark.parametrize("commit", [True, False])
def test_handler_writes_commit_together_with_the_completion(
    connect: Connections, conn: psycopg.Connection[Any], worker: int, commit: bool
) -> None:
    """Exactly-once inside the database: the handler's writes and the completion share a transaction."""
    conn.execute("CREATE TABLE IF NOT EXISTS public.ledger (job_id bigint PRIMARY KEY)")
    conn.execute("TRUNCATE public.ledger")
    job_id = fairqueue.enqueue(conn, "charge")
    [job] = fairqueue.claim_batch(conn, worker, 1)
    tx = connect(autocommit=False)
    tx.execute("INSERT INTO public.ledger VALUES (%s)", (job.id,))
    assert fairqueue.complete(tx, worker, job.id, {"ok": True})
    if commit:
        tx.commit()
    else:
        tx.rollback()
    ledger = conn.execute("SELECT count(*) FROM public.ledger").fetchone()
    info = fairqueue.get_job(conn, job_id)
    assert info is not None
    if commit:
        assert ledger == (1,) and info.status == "succeeded"
    else:
        # neither happened: the job is still running and will be finished (or recovered) again
        assert ledger == (0,) and info.status == "running"


def test_bad_outcomes_are_rejected(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue(conn, "k")
    [job] = fairqueue.claim_batch(conn, worker, 1)
    with pytest.raises(fairqueue.InvalidJobError, match="outcome must be one of"):
        fairqueue.finish(conn, worker, [fairqueue.Outcome(job.id, "exploded")])  # type: ignore[arg-type]
    with pytest.raises(fairqueue.InvalidJobError, match="result is not JSON-serialisable"):
        fairqueue.complete(conn, worker, job.id, {"x": object()})
    with pytest.raises(fairqueue.InvalidJobError, match="same job id twice"):
        fairqueue.finish(conn, worker, [fairqueue.Outcome(job.id), fairqueue.Outcome(job.id)])
    assert fairqueue.complete(conn, worker, job.id)


def test_claim_limit_is_checked(conn: psycopg.Connection[Any], worker: int) -> None:
    for bad in (0, 1001, True):
        with pytest.raises(ValueError, match="limit must be"):
            fairqueue.claim_batch(conn, worker, bad)


def test_get_job_of_unknown_id(conn: psycopg.Connection[Any]) -> None:
    assert fairqueue.get_job(conn, 12345) is None


def test_ids_leases_and_retry_times_are_checked_before_any_statement(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """What a caller gives the worker-side calls is checked first: an id past the bigint range, a lease
    or a retry delay whose end no datetime can hold, a worker name with control characters. The
    caller's transaction (a handler's, say) stays usable."""
    from fairqueue.inspection import job_attempts

    huge = 2**63
    job_id = fairqueue.enqueue(conn, "k", max_attempts=3)
    [job] = fairqueue.claim_batch(conn, worker, 1)
    tx = connect(autocommit=False)
    calls: list[tuple[Any, str]] = [
        (lambda: fairqueue.heartbeat(tx, huge), "worker_id must be a whole number"),
        (lambda: fairqueue.claim_batch(tx, huge, 1), "worker_id must be a whole number"),
        (lambda: fairqueue.deregister_worker(tx, 0), "worker_id must be a whole number"),
        (lambda: fairqueue.complete(tx, huge, job.id), "worker_id must be a whole number"),
        (lambda: fairqueue.release(tx, worker, [job.id, huge]), "job_id must be a whole number"),
        (lambda: fairqueue.finish(tx, worker, [fairqueue.Outcome(huge)]), "job_id must be a whole number"),
        (lambda: fairqueue.fail(tx, worker, job.id, "boom", retry_in=1e12), "retry_in must be at most 10 years"),
        (lambda: fairqueue.fail(tx, worker, job.id, "boom", retry_in=float("nan")), "retry_in must be a finite"),
        (lambda: fairqueue.register_worker(tx, "w", lease_seconds=1e12), "lease_seconds must be more than zero"),
        (lambda: fairqueue.heartbeat(tx, worker, lease_seconds=float("inf")), "lease_seconds must be more than"),
        (lambda: fairqueue.register_worker(tx, "w\x1b[2K"), "worker name must not contain control characters"),
        (lambda: job_attempts(tx, huge), "job_id must be a whole number"),
    ]
    for call, message in calls:
        with pytest.raises(ValueError, match=message):
            call()
        tx.execute("SELECT 1")  # the transaction is not aborted
    assert fairqueue.complete(tx, worker, job_id)
    tx.commit()
    info = fairqueue.get_job(conn, job_id)
    assert info is not None and info.status == "succeeded"
    assert count(conn, "worker") == 1
