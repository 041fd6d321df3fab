"""Invariant 2 (enqueue takes no lock anyone waits on) and invariant 3 (no lost wake-ups).

A producer's transaction stays open after it enqueues (it is the user's business transaction). Every
test here keeps one open and checks that others go on. "Goes on" is checked with a statement
timeout: a statement that had to wait for the open transaction would hit it and fail the test.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

import fairqueue
from tests.conftest import Connections
from tests.helpers import (
    ISOLATIONS,
    assert_consistent,
    claim_beside_a_held_channel,
    impatient,
    in_thread,
    wait_until_blocked_or_done,
)


def _open_producer(connect: Connections, isolation: str) -> psycopg.Connection[Any]:
    return connect(autocommit=False, isolation=isolation)


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("channel_state", ["new", "busy"])
def test_open_producer_does_not_block_another_producer_of_the_same_channel(
    connect: Connections, conn: psycopg.Connection[Any], isolation: str, channel_state: str
) -> None:
    if channel_state == "busy":
        fairqueue.enqueue(conn, "earlier", channel="bob")
        fairqueue.claim_batch(conn, fairqueue.register_worker(conn), 1)  # the channel is now active
        fairqueue.enqueue(conn, "earlier", channel="bob")
    holder = _open_producer(connect, isolation)
    fairqueue.enqueue(holder, "held", channel="bob")  # ... and the transaction stays open

    other = impatient(_open_producer(connect, isolation))
    fairqueue.enqueue(other, "other", channel="bob")
    fairqueue.enqueue_many(other, [{"kind": "bulk", "channel": "bob"}] * 100)
    other.commit()
    holder.commit()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_open_producer_does_not_hide_committed_jobs_of_its_channel(
    connect: Connections, conn: psycopg.Connection[Any], worker: int, isolation: str
) -> None:
    committed = fairqueue.enqueue(conn, "committed", channel="bob")
    holder = _open_producer(connect, isolation)
    fairqueue.enqueue(holder, "held", channel="bob")

    claimer = impatient(connect())
    assert [j.id for j in fairqueue.claim_batch(claimer, worker, 10)] == [committed]
    holder.rollback()


def test_open_bulk_producer_of_100k_jobs_blocks_nobody(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    first = fairqueue.enqueue(conn, "committed", channel="bob")
    holder = _open_producer(connect, "read committed")
    fairqueue.enqueue_many(holder, ({"kind": "bulk", "channel": "bob"} for _ in range(100_000)))

    other = impatient(_open_producer(connect, "read committed"))
    second = fairqueue.enqueue(other, "other", channel="bob")
    other.commit()
    claimer = impatient(connect())
    assert sorted(j.id for j in fairqueue.claim_batch(claimer, worker, 10)) == [first, second]
    holder.commit()
    assert len(fairqueue.claim_batch(claimer, worker, 1000)) == 1000


def test_configure_channel_does_not_wait_for_producers(connect: Connections) -> None:
    holder = _open_producer(connect, "read committed")
    fairqueue.enqueue(holder, "held", channel="bob")
    admin = impatient(connect())
    fairqueue.configure_channel(admin, "bob", max_concurrency=2)
    holder.commit()


def _busy_bob(conn: psycopg.Connection[Any], worker: int) -> None:
    """Bob's channel known to be busy (active), with one job left to claim."""
    fairqueue.enqueue_many(conn, [{"kind": "first", "channel": "bob"}, {"kind": "second", "channel": "bob"}])
    assert [j.kind for j in fairqueue.claim_batch(conn, worker, 1)] == ["first"]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_job_enqueued_while_its_channel_drains_is_still_claimed(
    connect: Connections, conn: psycopg.Connection[Any], worker: int, isolation: str
) -> None:
    """The lost wake-up race: a claimer drains the channel while a producer's insert is in flight."""
    _busy_bob(conn, worker)
    producer = _open_producer(connect, isolation)
    late = fairqueue.enqueue(producer, "late", channel="bob")  # bob looked busy: no wakeup needed?

    claimer = impatient(connect())
    assert [j.kind for j in fairqueue.claim_batch(claimer, worker, 10)] == ["second"]
    assert fairqueue.claim_batch(claimer, worker, 10) == []  # the claimer saw bob empty
    producer.commit()
    assert [j.id for j in fairqueue.claim_batch(claimer, worker, 10)] == [late]
    assert_consistent(conn)


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_producer_snapshot_from_before_the_channel_went_idle(
    connect: Connections, conn: psycopg.Connection[Any], worker: int, isolation: str
) -> None:
    """A snapshot taken while the channel was busy must not convince the producer it still is."""
    _busy_bob(conn, worker)
    producer = _open_producer(connect, isolation)
    producer.execute("SELECT count(*) FROM fairqueue.channel").fetchall()  # snapshot: bob is active
    assert [j.kind for j in fairqueue.claim_batch(conn, worker, 10)] == ["second"]  # bob goes idle
    late = fairqueue.enqueue(producer, "late", channel="bob")
    producer.commit()
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [late]
    assert_consistent(conn)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_job_for_a_never_seen_channel_is_claimed_after_commit(
    connect: Connections, conn: psycopg.Connection[Any], worker: int, isolation: str
) -> None:
    producer = _open_producer(connect, isolation)
    job = fairqueue.enqueue(producer, "first-ever", channel="brand-new")
    assert fairqueue.claim_batch(conn, worker, 10) == []
    producer.commit()
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [job]


def test_many_channels_in_one_read_committed_transaction(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """Past 64 channels a transaction stops taking advisory locks and leaves wakeups instead."""
    for i in range(100):
        fairqueue.enqueue(conn, "warm", channel=f"t{i}")
    fairqueue.claim_batch(conn, worker, 1000)  # all 100 channels drained and idle
    producer = _open_producer(connect, "read committed")
    ids = {fairqueue.enqueue(producer, "k", channel=f"t{i}") for i in range(100)}
    locks = producer.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    ).fetchone()
    assert locks is not None and locks[0] <= 64
    producer.commit()
    assert {j.id for j in fairqueue.claim_batch(conn, worker, 1000)} == ids
    assert_consistent(conn)


def test_busy_channel_needs_no_wakeup_rows(connect: Connections, conn: psycopg.Connection[Any], worker: int) -> None:
    """While a channel is known to be busy, producers (read committed) write nothing but the job."""
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 2)
    fairqueue.claim_batch(conn, worker, 1)  # consumes the wakeup; bob still has a job, so stays active
    producer = _open_producer(connect, "read committed")
    for _ in range(50):
        fairqueue.enqueue(producer, "k", channel="bob")
    producer.commit()
    row = conn.execute("SELECT count(*) FROM fairqueue.channel_wakeup").fetchone()
    assert row == (0,)


def test_idle_channel_gets_one_wakeup_per_transaction(connect: Connections, conn: psycopg.Connection[Any]) -> None:
    producer = _open_producer(connect, "repeatable read")
    for _ in range(50):
        fairqueue.enqueue(producer, "k", channel="bob")
    producer.commit()
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_wakeup").fetchone() == (1,)


def test_ready_job_locked_elsewhere_during_a_claim_is_not_stranded(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """A claim skips rows another transaction has locked (e.g. a cancel in progress); it must not take
    the channel for empty and idle it while such a row is still ready."""
    job = fairqueue.enqueue(conn, "k", channel="bob")
    other = connect(autocommit=False)
    other.execute("SELECT 1 FROM fairqueue.running_job WHERE job_id = %s FOR UPDATE", (job,))
    assert fairqueue.claim_batch(impatient(connect()), worker, 10) == []
    other.rollback()
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [job]
    assert_consistent(conn)


@pytest.mark.parametrize(("isolation", "wakeups"), [("read committed", 0), ("repeatable read", 2)])
def test_many_enqueues_across_a_few_channels_write_no_wakeup_per_job(
    connect: Connections, conn: psycopg.Connection[Any], worker: int, isolation: str, wakeups: int
) -> None:
    """A transaction alternating between busy channels, past the 64-lock budget, still needs at most
    one wakeup row per channel (none at all under READ COMMITTED: they are busy)."""
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": c} for c in ("a", "b") for _ in range(2)])
    fairqueue.claim_batch(conn, worker, 2)  # a and b active, one job left each
    producer = _open_producer(connect, isolation)
    for i in range(200):
        fairqueue.enqueue(producer, "k", channel="ab"[i % 2])
    producer.commit()
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_wakeup").fetchone() == (wakeups,)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_enqueue_again_after_a_rolled_back_savepoint_still_wakes_the_channel(
    connect: Connections, conn: psycopg.Connection[Any], worker: int, isolation: str
) -> None:
    """The transaction's memory of covered channels is undone with the savepoint's wakeup row."""
    producer = _open_producer(connect, isolation)
    with producer.transaction(force_rollback=True):
        fairqueue.enqueue(producer, "dropped", channel="bob")
    kept = fairqueue.enqueue(producer, "kept", channel="bob")
    producer.commit()
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [kept]


def test_a_claim_that_idled_a_channel_does_not_then_wait_for_a_busy_one(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """Idling a channel takes its exclusive lock until the claim commits, and a producer enqueueing
    into that channel would wait for it: after idling, the claim no longer waits for a held channel."""
    fairqueue.configure_channel(conn, "capped", max_concurrency=100)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "capped"}] * 20)
    fairqueue.enqueue(conn, "k", channel="x")
    worker = fairqueue.register_worker(conn)
    assert {j.channel for j in fairqueue.claim_batch(conn, worker, 2)} == {"capped", "x"}
    conn.execute("UPDATE fairqueue.channel SET active = true WHERE name = 'x'")  # drained, not idled yet
    waited, got = claim_beside_a_held_channel(conn, connect, "capped", worker, 5)
    assert not waited, "after idling x the claim waited for capped, holding x's lock against producers"
    assert got == []  # and the next claim takes capped's jobs
    assert conn.execute("SELECT active FROM fairqueue.channel WHERE name = 'x'").fetchone() == (False,)
    assert len(fairqueue.claim_batch(impatient(connect()), worker, 5)) == 5


def _wait_until_waiting(conn: psycopg.Connection[Any], pid: int, thread: threading.Thread) -> bool:
    """Waits until the session ``pid`` waits on a lock (True) or ``thread`` has finished (False)."""
    return wait_until_blocked_or_done(conn, thread, pid=pid)


def test_producer_arriving_while_a_claimer_idles_its_channel_leaves_a_wakeup(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """Invariant 3, the producer's ordering: it takes the channel's shared lock *before* it reads
    whether the channel is active. Here a claimer has just marked bob idle and keeps its transaction
    open (holding bob's exclusive lock). A producer that read "active" first would see bob's last
    committed row (still active), then get the lock once the claimer commits, and leave no wakeup:
    its job would sit in an idle channel. Taking the lock first, it waits for the claimer, then
    reads bob idle and wakes it."""
    _busy_bob(conn, worker)
    claimer = connect(autocommit=False)
    assert [j.kind for j in fairqueue.claim_batch(claimer, worker, 10)] == ["second"]
    idle = conn.execute("SELECT active FROM fairqueue.channel WHERE name = 'bob'").fetchone()
    assert idle == (True,)  # the claimer's "idle" is not committed yet
    producer = _open_producer(connect, "read committed")
    late: list[int] = []

    def enqueue() -> None:
        late.append(fairqueue.enqueue(producer, "late", channel="bob"))
        producer.commit()

    t, errors = in_thread(enqueue)
    assert _wait_until_waiting(conn, producer.info.backend_pid, t), "the producer did not wait for the claimer"
    claimer.commit()
    t.join()
    assert not errors, errors
    assert [j.id for j in fairqueue.claim_batch(impatient(connect()), worker, 10)] == late
    assert_consistent(conn)


@pytest.mark.parametrize("held", ["a", "b"])
def test_job_committed_while_an_idle_check_is_under_way_is_not_stranded(
    connect: Connections, conn: psycopg.Connection[Any], held: str
) -> None:
    """Invariant 3, the claimer's ordering: the idle check takes the exclusive locks first and then
    looks for ready jobs in a *new* statement. If it looked in the statement that takes the lock, its
    snapshot could predate a producer that enqueued, committed and released its shared lock before
    the lock was taken: the check would find the channel empty and idle it, stranding the job.

    The idle check of channels a and b is held at its first channel (the test holds that row, as a
    concurrent configure_channel could) while a producer enqueues into the other one and commits.
    Which row the check reaches first depends on the plan, so both ways are run."""
    produced = "b" if held == "a" else "a"
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": c} for c in ("a", "b")])
    worker = fairqueue.register_worker(conn, "w", lease_seconds=300)
    assert {j.channel for j in fairqueue.claim_batch(conn, worker, 10)} == {"a", "b"}
    conn.execute("UPDATE fairqueue.channel SET active = true")  # drained, not idled yet
    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM fairqueue.channel WHERE name = %s FOR NO KEY UPDATE", (held,))
    checker = connect(autocommit=False)
    checker_pid = checker.info.backend_pid

    def idle_check() -> None:
        checker.execute("SELECT fairqueue._idle_channels(ARRAY['a', 'b'])")
        checker.commit()

    c, c_errors = in_thread(idle_check)
    assert _wait_until_waiting(conn, checker_pid, c), "the idle check did not reach the held row"
    producer = _open_producer(connect, "read committed")
    job: list[int] = []

    def enqueue() -> None:
        job.append(fairqueue.enqueue(producer, "late", channel=produced))
        producer.commit()

    p, p_errors = in_thread(enqueue)
    _wait_until_waiting(conn, producer.info.backend_pid, p)  # done (it raced the check) or waiting for it
    holder.commit()
    c.join()
    p.join()
    assert not c_errors and not p_errors, (c_errors, p_errors)
    assert [j.id for j in fairqueue.claim_batch(impatient(connect()), worker, 10)] == job
    assert_consistent(conn)
