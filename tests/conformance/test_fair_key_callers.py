"""fair_key on every caller kind (see conftest.py): enqueue, enqueue_many and bulk_enqueue store the key
with the caller's transaction (and the async API's counterparts do the same); a bad key raises before
anything is written and leaves the caller's transaction usable."""

from __future__ import annotations

from typing import Any

import pytest

import fairqueue
from tests.conformance.conftest import ORDERS, Caller
from tests.helpers import assert_consistent, count


def test_every_producer_call_stores_the_fair_key_at_commit(caller: Caller) -> None:
    with caller.transaction() as tx:
        tx.fq.enqueue(tx.db, "one", channel="acme", fair_key="user-1")
        tx.fq.enqueue_many(
            tx.db,
            [{"kind": "many", "channel": "acme", "fair_key": "user-2"}, fairqueue.JobSpec("many", channel="acme")],
        )
        tx.fq.bulk_enqueue(tx.db, [{"kind": "bulk", "channel": "acme", "fair_key": f"user-{i}"} for i in (3, 4)])
        if not caller.kind.endswith("_asyncpg"):  # a bulk run needs COPY through psycopg
            tx.fq.bulk_enqueue(tx.db, [{"kind": "run", "channel": "acme", "fair_key": "user-5"}], run_id="run-1")
        assert count(caller.conn, "job") == 0  # not before the caller commits
        tx.commit()
    rows = caller.conn.execute(
        "SELECT j.kind, j.fair_key, r.fair_key FROM fairqueue.job j JOIN fairqueue.running_job r ON r.job_id = j.id "
        "ORDER BY j.id"
    ).fetchall()
    assert rows == [
        ("one", "user-1", "user-1"),
        ("many", "user-2", "user-2"),
        ("many", None, None),
        ("bulk", "user-3", "user-3"),
        ("bulk", "user-4", "user-4"),
        *([] if caller.kind.endswith("_asyncpg") else [("run", "user-5", "user-5")]),
    ]
    assert_consistent(caller.conn)


BAD_KEY_CALLS: dict[str, Any] = {
    "enqueue": lambda fq, db: fq.enqueue(db, "k", fair_key=""),
    "enqueue_many": lambda fq, db: fq.enqueue_many(db, [{"kind": "k"}, {"kind": "k", "fair_key": "x" * 256}]),
    "bulk_enqueue": lambda fq, db: fq.bulk_enqueue(db, [{"kind": "k"}, {"kind": "k", "fair_key": "a\nb"}]),
}
MESSAGES = {
    "enqueue": "fair_key must be 1 to 255 characters long, got 0",
    "enqueue_many": "job #1: fair_key must be 1 to 255 characters long, got 256",
    "bulk_enqueue": "job #1: fair_key must not contain control characters",
}


@pytest.mark.parametrize("operation", list(BAD_KEY_CALLS))
def test_a_bad_fair_key_writes_nothing_and_the_transaction_goes_on(caller: Caller, operation: str) -> None:
    with caller.transaction() as tx:
        tx.execute(f"INSERT INTO {ORDERS} (note) VALUES ('before')")
        with pytest.raises(fairqueue.InvalidJobError, match=MESSAGES[operation]):
            BAD_KEY_CALLS[operation](tx.fq, tx.db)
        assert count(caller.conn, "job") == 0
        tx.fq.enqueue(tx.db, "k", fair_key="fine")  # the caller's transaction is still usable
        tx.commit()
    assert caller.orders() == 1 and count(caller.conn, "job") == 1


def test_a_job_added_to_a_key_in_turn_is_written_alone_and_claimed(caller: Caller, worker_of: int) -> None:
    """Every caller kind runs READ COMMITTED by default, so a key already in turn needs no wakeup
    (_cover_key, schema/10_enqueue.sql) whichever way the job is enqueued, and the claims that serve
    the key take the jobs."""
    worker = worker_of
    earlier = fairqueue.enqueue_many(caller.conn, [fairqueue.JobSpec("earlier", channel="acme", fair_key="alice")] * 2)
    (first,) = fairqueue.claim_batch(caller.conn, worker, 1)
    fairqueue.finish(caller.conn, worker, [fairqueue.Outcome(first.id)])  # alice in turn, one job ready
    with caller.transaction() as tx:
        one = tx.fq.enqueue(tx.db, "one", channel="acme", fair_key="alice")
        many = tx.fq.enqueue_many(tx.db, [fairqueue.JobSpec("many", channel="acme", fair_key="alice")] * 2)
        tx.commit()
    wakeups = caller.conn.execute("SELECT count(*) FROM fairqueue.channel_wakeup").fetchone()
    assert wakeups == (0,)
    assert [j.id for j in fairqueue.claim_batch(caller.conn, worker, 10)] == [earlier[1], one, *many]
    assert_consistent(caller.conn)
