"""Scheduling semantics: run_at, after (dependencies), fifo_key, unique_key and cancel."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue.outcomes import OutcomeName
from tests.conftest import Connections
from tests.helpers import assert_consistent, count, drain, race_against_open_transaction


def _make_due(conn: psycopg.Connection[Any]) -> None:
    conn.execute("UPDATE fairqueue.scheduled_job SET run_at = now() - interval '1 second'")


def _status(conn: psycopg.Connection[Any], job_id: int) -> str:
    info = fairqueue.get_job(conn, job_id)
    assert info is not None
    return info.status


# -- run_at ------------------------------------------------------------------------------------------


def test_scheduled_job_becomes_eligible_at_run_at(conn: psycopg.Connection[Any], worker: int) -> None:
    job = fairqueue.enqueue(conn, "later", run_at=datetime.now(UTC) + timedelta(minutes=5), channel="bob")
    assert _status(conn, job) == "scheduled"
    assert fairqueue.claim_batch(conn, worker, 10) == []
    _make_due(conn)
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [job]


def test_due_scheduled_jobs_are_served_fairly(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob", "delay": 60}] * 100)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "alice", "delay": 60}] * 2)
    _make_due(conn)
    first = fairqueue.claim_batch(conn, worker, 4)
    assert sorted(j.channel for j in first) == ["alice", "alice", "bob", "bob"]


# -- after -------------------------------------------------------------------------------------------


def test_dependant_waits_for_its_dependency_to_succeed(conn: psycopg.Connection[Any], worker: int) -> None:
    parent = fairqueue.enqueue(conn, "parent")
    child = fairqueue.enqueue(conn, "child", after=[parent])
    [job] = fairqueue.claim_batch(conn, worker, 10)
    assert job.id == parent
    assert _status(conn, child) == "blocked"
    fairqueue.complete(conn, worker, parent)
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [child]
    assert_consistent(conn)


def test_dependant_of_a_finished_job_runs_at_once(conn: psycopg.Connection[Any], worker: int) -> None:
    parent = fairqueue.enqueue(conn, "parent")
    drain(conn, worker)
    child = fairqueue.enqueue(conn, "child", after=[parent])
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [child]


def test_dependants_fail_when_a_dependency_fails_for_good(conn: psycopg.Connection[Any], worker: int) -> None:
    a = fairqueue.enqueue(conn, "a")
    b = fairqueue.enqueue(conn, "b", after=[a])
    c = fairqueue.enqueue(conn, "c", after=[b])
    unrelated = fairqueue.enqueue(conn, "d")
    claimed = fairqueue.claim_batch(conn, worker, 10)
    assert sorted(j.id for j in claimed) == [a, unrelated]
    fairqueue.fail(conn, worker, a, "boom")
    for dependant, cause, outcome in ((b, a, "failed"), (c, b, "dependency_failed")):
        info = fairqueue.get_job(conn, dependant)
        assert info is not None and info.status == "dependency_failed"
        assert info.error == f"dependency {cause} ended with outcome {outcome}"
    assert_consistent(conn)


@pytest.mark.parametrize("outcome", ["failed", "timed_out", "lost", "cancelled"])
def test_dependants_fail_whichever_way_a_dependency_ends_without_success(
    conn: psycopg.Connection[Any], worker: int, outcome: OutcomeName
) -> None:
    """ "If one ends otherwise [than succeeded], this job ends as dependency_failed" (guide.md): a
    dependency that ended timed_out, lost or cancelled fails its dependants like a failure does, both
    those already waiting for it (transitively) and one enqueued after it ended."""
    holder = fairqueue.register_worker(conn, "holder", lease_seconds=300)
    a = fairqueue.enqueue(conn, "a", max_attempts=1)
    b = fairqueue.enqueue(conn, "b", after=[a])
    c = fairqueue.enqueue(conn, "c", after=[b])
    assert [j.id for j in fairqueue.claim_batch(conn, holder, 10)] == [a]
    assert _status(conn, b) == "blocked"
    if outcome == "lost":  # its worker died: the lease ran out and the fleet recovered the job
        conn.execute(
            "UPDATE fairqueue.worker SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (holder,)
        )
        assert fairqueue.recover_expired_workers(conn) == 1
    else:
        fairqueue.finish(conn, holder, [fairqueue.Outcome(a, outcome, error=outcome, retry_in=1.0)])
    assert _status(conn, a) == outcome
    late = fairqueue.enqueue(conn, "late", after=[a])
    assert fairqueue.claim_batch(conn, worker, 10) == []  # places late: nothing may run
    for dependant, cause, why in ((b, a, outcome), (c, b, "dependency_failed"), (late, a, outcome)):
        info = fairqueue.get_job(conn, dependant)
        assert info is not None and info.status == "dependency_failed", (dependant, info)
        assert info.error == f"dependency {cause} ended with outcome {why}"
    assert count(conn, "job") == 0
    assert_consistent(conn)


def test_job_waits_for_all_of_its_dependencies(conn: psycopg.Connection[Any], worker: int) -> None:
    a, b = fairqueue.enqueue(conn, "a"), fairqueue.enqueue(conn, "b")
    child = fairqueue.enqueue(conn, "child", after=[a, b])
    fairqueue.claim_batch(conn, worker, 10)
    fairqueue.complete(conn, worker, a)
    assert fairqueue.claim_batch(conn, worker, 10) == []
    fairqueue.complete(conn, worker, b)
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [child]


def test_dependencies_finishing_at_once_release_the_dependant_exactly_once(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    parents = [fairqueue.enqueue(conn, "parent", channel=f"p{i}") for i in range(8)]
    child = fairqueue.enqueue(conn, "child", after=parents, channel="child")
    workers = [fairqueue.register_worker(conn) for _ in parents]
    for w in workers:
        fairqueue.claim_batch(conn, w, 1)
    held = {r[0]: r[1] for r in conn.execute("SELECT worker_id, job_id FROM fairqueue.running_job")}
    barrier = threading.Barrier(len(workers))
    errors: list[BaseException] = []

    def finish(w: int) -> None:
        try:
            c = connect()
            barrier.wait()
            fairqueue.complete(c, w, held[w])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert [j.id for j in fairqueue.claim_batch(conn, workers[0], 10)] == [child]
    assert_consistent(conn)


def test_second_dependency_finishing_while_the_first_is_uncommitted(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """Finisher 1 has released its dependency but not committed; finisher 2 must not conclude that
    the dependant still waits for it (nor may both place it)."""
    p1 = fairqueue.enqueue(conn, "parent", channel="p1")
    p2 = fairqueue.enqueue(conn, "parent", channel="p2")
    child = fairqueue.enqueue(conn, "child", after=[p1, p2], channel="child")
    w1, w2 = fairqueue.register_worker(conn), fairqueue.register_worker(conn)
    assert [j.id for j in fairqueue.claim_batch(conn, w1, 1)] == [p1]
    assert [j.id for j in fairqueue.claim_batch(conn, w2, 1)] == [p2]

    tx1 = connect(autocommit=False)
    fairqueue.complete(tx1, w1, p1)  # not committed yet
    race_against_open_transaction(conn, tx1, lambda: fairqueue.complete(connect(), w2, p2))
    assert [j.id for j in fairqueue.claim_batch(conn, w1, 10)] == [child]
    assert_consistent(conn)


def test_dependency_finishing_while_its_dependant_is_being_placed(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """A claim places a dependant (dependency still running) but has not committed; the dependency
    finishes meanwhile. The finisher must see the new dependency row and release the dependant."""
    parent = fairqueue.enqueue(conn, "parent", channel="p")
    w1, w2 = fairqueue.register_worker(conn), fairqueue.register_worker(conn)
    assert [j.id for j in fairqueue.claim_batch(conn, w1, 1)] == [parent]
    child = fairqueue.enqueue(conn, "child", after=[parent], channel="c")

    placing = connect(autocommit=False)
    assert fairqueue.claim_batch(placing, w2, 10) == []  # its intake placed the child: blocked on parent
    race_against_open_transaction(conn, placing, lambda: fairqueue.complete(connect(), w1, parent))
    assert [j.id for j in fairqueue.claim_batch(conn, w2, 10)] == [child]
    assert_consistent(conn)


def test_dependency_enqueued_in_the_same_transaction(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    tx = connect(autocommit=False)
    parent = fairqueue.enqueue(tx, "parent")
    child = fairqueue.enqueue(tx, "child", after=[parent])
    tx.commit()
    assert [j.id for j in drain(conn, worker)] == [parent, child]


# -- fifo_key ----------------------------------------------------------------------------------------


def test_fifo_key_runs_one_at_a_time_in_order(conn: psycopg.Connection[Any], worker: int) -> None:
    ids = [fairqueue.enqueue(conn, "k", fifo_key="account-7", channel="bob") for _ in range(5)]
    other = fairqueue.enqueue(conn, "k", fifo_key="account-8", channel="bob")
    order: list[int] = []
    for _ in range(5):
        batch = fairqueue.claim_batch(conn, worker, 10)
        order.extend(j.id for j in batch if j.id in ids)
        assert sum(j.id in ids for j in batch) == 1
        fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in batch])
    assert order == ids
    assert _status(conn, other) == "succeeded"
    assert_consistent(conn)


def test_fifo_key_is_held_while_the_job_retries(conn: psycopg.Connection[Any], worker: int) -> None:
    first = fairqueue.enqueue(conn, "k", fifo_key="acct", max_attempts=2)
    second = fairqueue.enqueue(conn, "k", fifo_key="acct")
    [job] = fairqueue.claim_batch(conn, worker, 10)
    assert job.id == first
    fairqueue.fail(conn, worker, first, "try again", retry_in=60)
    assert fairqueue.claim_batch(conn, worker, 10) == []  # second may not overtake the retrying first
    _make_due(conn)
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [first]
    fairqueue.fail(conn, worker, first, "gave up")
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [second]


def test_fifo_holder_finishing_while_the_next_job_is_being_placed(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    holder = fairqueue.enqueue(conn, "k", fifo_key="acct", channel="a")
    w1, w2 = fairqueue.register_worker(conn), fairqueue.register_worker(conn)
    assert [j.id for j in fairqueue.claim_batch(conn, w1, 1)] == [holder]
    follower = fairqueue.enqueue(conn, "k", fifo_key="acct", channel="a")

    placing = connect(autocommit=False)
    assert fairqueue.claim_batch(placing, w2, 10) == []  # its intake queued the follower behind the holder
    race_against_open_transaction(conn, placing, lambda: fairqueue.complete(connect(), w1, holder))
    assert [j.id for j in fairqueue.claim_batch(conn, w2, 10)] == [follower]
    assert_consistent(conn)


def test_cancelling_the_fifo_holder_passes_the_key_on(conn: psycopg.Connection[Any], worker: int) -> None:
    first = fairqueue.enqueue(conn, "k", fifo_key="acct")
    second = fairqueue.enqueue(conn, "k", fifo_key="acct")
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [first]
    fairqueue.complete(conn, worker, first)
    assert fairqueue.cancel(conn, second) == "cancelled"
    third = fairqueue.enqueue(conn, "k", fifo_key="acct")
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [third]
    assert_consistent(conn)


# -- unique_key --------------------------------------------------------------------------------------


def test_unique_key_returns_the_unfinished_job(conn: psycopg.Connection[Any], worker: int) -> None:
    first = fairqueue.enqueue(conn, "report", unique_key="report:2026-11")
    assert fairqueue.enqueue(conn, "report", unique_key="report:2026-11") == first
    with pytest.raises(fairqueue.DuplicateJobError) as err:
        fairqueue.enqueue(conn, "report", unique_key="report:2026-11", on_duplicate="raise")
    assert err.value.existing_job_id == first
    drain(conn, worker)
    second = fairqueue.enqueue(conn, "report", unique_key="report:2026-11")
    assert second != first


def test_unique_keys_in_bulk(conn: psycopg.Connection[Any]) -> None:
    existing = fairqueue.enqueue(conn, "k", unique_key="a")
    ids = fairqueue.enqueue_many(
        conn,
        [
            {"kind": "k", "unique_key": "a"},
            {"kind": "k", "unique_key": "b"},
            {"kind": "k", "unique_key": "b"},
            {"kind": "k"},
        ],
    )
    assert ids[0] == existing and ids[1] == ids[2] and len(set(ids)) == 3
    assert count(conn, "job") == 3


# -- cancel ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["ready", "scheduled", "blocked", "waiting"])
def test_cancelled_queued_job_never_runs(conn: psycopg.Connection[Any], worker: int, where: str) -> None:
    # (a FIFO key belongs to its channel: the blocker holds the victim's channel's key)
    blocker = (
        fairqueue.enqueue(conn, "blocker", fifo_key="f", channel="held") if where in ("blocked", "waiting") else None
    )
    if blocker:
        fairqueue.claim_batch(conn, worker, 10)  # the blocker runs and holds the FIFO key
    job = fairqueue.enqueue(
        conn,
        "victim",
        delay=60 if where == "scheduled" else None,
        after=[blocker] if where == "blocked" and blocker else None,
        fifo_key="f" if where == "waiting" else None,
        channel="held",
    )
    fairqueue.configure_channel(conn, "held", paused=True)  # a ready job stays ready
    fairqueue.claim_batch(conn, worker, 10)  # placement happens at claims
    assert _status(conn, job) == where
    assert fairqueue.cancel(conn, job) == "cancelled"
    assert fairqueue.cancel(conn, job) == "finished"
    _make_due(conn)
    fairqueue.configure_channel(conn, "held", paused=False)
    if blocker:
        fairqueue.complete(conn, worker, blocker)
    assert all(j.id != job for j in drain(conn, worker))
    assert _status(conn, job) == "cancelled"
    assert_consistent(conn)


def test_cancelling_a_running_job_asks_its_worker(conn: psycopg.Connection[Any], worker: int) -> None:
    job = fairqueue.enqueue(conn, "long")
    fairqueue.claim_batch(conn, worker, 1)
    assert fairqueue.cancel(conn, job) == "cancel_requested"
    assert conn.execute("SELECT cancel_requested FROM fairqueue.running_job").fetchone() == (True,)
    fairqueue.finish(conn, worker, [fairqueue.Outcome(job, "cancelled")])
    assert _status(conn, job) == "cancelled"


def test_cancel_unknown_job(conn: psycopg.Connection[Any]) -> None:
    assert fairqueue.cancel(conn, 424242) == "not_found"


def test_cancelling_a_dependency_fails_its_dependants(conn: psycopg.Connection[Any], worker: int) -> None:
    parent = fairqueue.enqueue(conn, "parent", delay=60)
    child = fairqueue.enqueue(conn, "child", after=[parent])
    fairqueue.claim_batch(conn, worker, 10)
    assert fairqueue.cancel(conn, parent) == "cancelled"
    info = fairqueue.get_job(conn, child)
    assert info is not None and info.status == "dependency_failed"
    assert info.error == f"dependency {parent} ended with outcome cancelled"


# -- the maintenance role's intake ----------------------------------------------------------------------


def _notifications(listener: psycopg.Connection[Any]) -> int:
    return sum(1 for _ in listener.notifies(timeout=0.2, stop_after=1))


def test_promote_due_jobs_wakes_idle_workers_when_it_takes_work_in(
    conn: psycopg.Connection[Any], connect: Connections
) -> None:
    """The maintenance role's intake can win a fresh wakeup from an idle worker's claim: it then has
    to notify, or the job waits for the next poll (a flake of the listener test, once in ~20 runs)."""
    listener = connect()
    listener.execute("LISTEN fairqueue")
    fairqueue.enqueue(conn, "k", channel="bob")  # notifies: an idle worker claims, finds the wakeup ...
    assert _notifications(listener) == 1
    conn.execute("SELECT fairqueue.promote_due_jobs()")  # ... unless maintenance took it in first
    assert _notifications(listener) == 1, "an idle worker would not learn that bob is ready"
    fairqueue.enqueue(conn, "later", channel="alice", delay=60)
    _notifications(listener)
    _make_due(conn)
    conn.execute("SELECT fairqueue.promote_due_jobs()")
    assert _notifications(listener) == 1, "a due job made ready by maintenance must wake a worker"
    conn.execute("SELECT fairqueue.promote_due_jobs()")  # nothing left to take in: stays quiet
    assert _notifications(listener) == 0


def test_producers_notify_for_an_idle_channel_but_not_for_an_active_one(
    conn: psycopg.Connection[Any], connect: Connections, worker: int
) -> None:
    """A NOTIFY takes a database-wide lock at commit, serialising producers: one is sent only when
    a worker may be waiting for it (the channel was idle, so a wakeup row was left)."""
    listener = connect()
    listener.execute("LISTEN fairqueue")
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 2)  # bob idle: a wakeup row, a notification
    assert _notifications(listener) == 1
    assert len(fairqueue.claim_batch(conn, worker, 1)) == 1  # bob active, one job still ready
    fairqueue.enqueue(conn, "k", channel="bob")  # bob is active: no wakeup row, no notification
    assert _notifications(listener) == 0
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_wakeup").fetchone() == (0,)
    assert len(fairqueue.claim_batch(conn, worker, 10)) == 2  # bob drained and idle again
    fairqueue.enqueue(conn, "k", channel="bob")
    assert _notifications(listener) == 1


def test_next_due_is_now_while_a_channel_is_eligible(conn: psycopg.Connection[Any], worker: int) -> None:
    def next_due() -> float | None:
        row = conn.execute("SELECT fairqueue.next_due()").fetchone()
        assert row is not None
        return None if row[0] is None else float(row[0])

    assert next_due() is None  # nothing at all
    fairqueue.enqueue(conn, "k", channel="bob", delay=60)
    assert 50 < (next_due() or 0) <= 60  # the delayed job
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 2)
    fairqueue.claim_batch(conn, worker, 1)  # bob active with a ready job
    assert next_due() == 0
    fairqueue.claim_batch(conn, worker, 5)  # bob drained and idle: back to the delayed job
    assert 50 < (next_due() or 0) <= 60
