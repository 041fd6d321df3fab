"""limits= on every caller kind (see conftest.py): enqueue and enqueue_many store a job's shared limits
with the caller's transaction (the async API's counterparts do the same), and the job waits for its
limit's slot like any other; a limit that is not configured, or a bad list, raises InvalidJobError
before anything is written and leaves the caller's transaction usable (bulk_enqueue too: its COPY
path carries each job's limits since schema fq0021, and checks their names first)."""

from __future__ import annotations

from typing import Any

import pytest

import fairqueue
from tests.conformance.conftest import ORDERS, Caller
from tests.helpers import assert_consistent, count


def test_every_producer_call_stores_the_limits_at_commit(caller: Caller) -> None:
    fairqueue.configure_limit(caller.conn, "stripe-api", max_concurrency=1)
    fairqueue.configure_limit(caller.conn, "mailer", rate_limit="100/s")
    with caller.transaction() as tx:
        one = tx.fq.enqueue(tx.db, "one", channel="acme", limits=["stripe-api"])
        both, free = tx.fq.enqueue_many(
            tx.db,
            [
                {"kind": "many", "channel": "globex", "limits": ["mailer", "stripe-api"]},
                fairqueue.JobSpec("many", channel="globex"),
            ],
        )
        assert count(caller.conn, "job") == 0  # not before the caller commits
        tx.commit()
    rows = caller.conn.execute("SELECT id, limits FROM fairqueue.job ORDER BY id").fetchall()
    assert rows == [(one, ["stripe-api"]), (both, ["mailer", "stripe-api"]), (free, None)]  # names sorted
    # the limits hold for these jobs as for any: stripe-api has one slot, so one of its two jobs runs
    worker = fairqueue.register_worker(caller.conn, "w", lease_seconds=60)
    claimed = {j.id for j in fairqueue.claim_batch(caller.conn, worker, 10)}
    assert free in claimed and len(claimed & {one, both}) == 1 and len(claimed) == 2
    assert_consistent(caller.conn)


def test_bulk_enqueue_stores_the_limits_at_commit(caller: Caller) -> None:
    fairqueue.configure_limit(caller.conn, "stripe-api", max_concurrency=1)
    with caller.transaction() as tx:
        result = tx.fq.bulk_enqueue(
            tx.db,
            [
                {"kind": "bulk", "channel": "acme", "limits": ["stripe-api"]},
                fairqueue.JobSpec("bulk", channel="globex", limits=["stripe-api"]),
                {"kind": "bulk", "channel": "globex"},
            ],
        )
        assert (result.jobs, result.created) == (3, 3)
        assert count(caller.conn, "job") == 0  # not before the caller commits
        tx.commit()
    rows = caller.conn.execute("SELECT id, channel, limits FROM fairqueue.job ORDER BY id").fetchall()
    assert [r[1:] for r in rows] == [("acme", ["stripe-api"]), ("globex", ["stripe-api"]), ("globex", None)]
    worker = fairqueue.register_worker(caller.conn, "w", lease_seconds=60)
    claimed = {j.id for j in fairqueue.claim_batch(caller.conn, worker, 10)}
    # the job without limits, and one of the two that share stripe-api's one slot
    assert rows[2][0] in claimed and len(claimed & {rows[0][0], rows[1][0]}) == 1 and len(claimed) == 2
    assert_consistent(caller.conn)


BAD_LIMIT_CALLS: dict[str, Any] = {
    "enqueue": lambda fq, db: fq.enqueue(db, "k", limits=["nope"]),
    "enqueue_many": lambda fq, db: fq.enqueue_many(
        db, [{"kind": "k", "limits": ["api"]}, {"kind": "k", "limits": ["nope"]}]
    ),
    "enqueue_many_type": lambda fq, db: fq.enqueue_many(db, [{"kind": "k"}, {"kind": "k", "limits": "api"}]),
    "bulk_enqueue": lambda fq, db: fq.bulk_enqueue(
        db, [{"kind": "k", "limits": ["api"]}, {"kind": "k", "limits": ["nope"]}]
    ),
}
MESSAGES = {
    "enqueue": r"^shared limit 'nope' is not configured \(see fairqueue.configure_limit\)$",
    "enqueue_many": r"^job #1: shared limit 'nope' is not configured",
    "enqueue_many_type": r"^job #1: limits must be a list of shared limit names",
    "bulk_enqueue": r"^job #1: shared limit 'nope' is not configured",
}


@pytest.mark.parametrize("operation", list(BAD_LIMIT_CALLS))
def test_a_bad_limit_writes_nothing_and_the_transaction_goes_on(caller: Caller, operation: str) -> None:
    fairqueue.configure_limit(caller.conn, "api", max_concurrency=2)
    with caller.transaction() as tx:
        tx.execute(f"INSERT INTO {ORDERS} (note) VALUES ('before')")
        with pytest.raises(fairqueue.InvalidJobError, match=MESSAGES[operation]):
            BAD_LIMIT_CALLS[operation](tx.fq, tx.db)
        assert count(caller.conn, "job") == 0
        tx.fq.enqueue(tx.db, "k", limits=["api"])  # the caller's transaction is still usable
        tx.commit()
    assert caller.orders() == 1 and count(caller.conn, "job") == 1


def _limit_settings(caller: Caller, name: str) -> tuple[Any, ...] | None:
    return caller.conn.execute(
        "SELECT max_concurrency, rate_limit, rate_burst FROM fairqueue.shared_limit WHERE name = %s", (name,)
    ).fetchone()


def test_configure_limit_takes_effect_with_the_commit(caller: Caller) -> None:
    with caller.transaction() as tx:
        tx.fq.configure_limit(tx.db, "api", max_concurrency=2, rate_limit="10/s", burst=5)
        tx.rollback()
    assert _limit_settings(caller, "api") is None
    with caller.transaction() as tx:
        tx.fq.configure_limit(tx.db, "api", max_concurrency=2, rate_limit="10/s", burst=5)
        tx.fq.enqueue(tx.db, "k", channel="acme", limits=["api"])  # known to the same transaction
        tx.commit()
    assert _limit_settings(caller, "api") == (2, "10/s", 5)
    with caller.transaction() as tx:  # every setting, each time: the ones left out go back to defaults
        tx.fq.configure_limit(tx.db, "api", max_concurrency=3)
        tx.commit()
    assert _limit_settings(caller, "api") == (3, None, 1)


def test_bad_limit_settings_write_nothing_and_the_transaction_goes_on(caller: Caller) -> None:
    with caller.transaction() as tx:
        tx.execute(f"INSERT INTO {ORDERS} (note) VALUES ('before')")
        with pytest.raises(fairqueue.InvalidChannelConfigError, match="max_concurrency must be a whole number"):
            tx.fq.configure_limit(tx.db, "api", max_concurrency=0)
        with pytest.raises(fairqueue.InvalidChannelConfigError, match="is not understood"):
            tx.fq.configure_limit(tx.db, "api", rate_limit="fast")
        tx.fq.configure_limit(tx.db, "api", max_concurrency=1)
        tx.commit()
    assert caller.orders() == 1 and _limit_settings(caller, "api") == (1, None, 1)


def test_update_and_remove_limit_take_effect_with_the_commit(caller: Caller) -> None:
    fairqueue.configure_limit(caller.conn, "api", max_concurrency=2, rate_limit="10/s", burst=5)
    with caller.transaction() as tx:
        assert tx.fq.update_limit(tx.db, "api", max_concurrency=4) == fairqueue.LimitSettings("api", 4, "10/s", 5)
        tx.rollback()
    assert _limit_settings(caller, "api") == (2, "10/s", 5)
    with caller.transaction() as tx:  # some settings: the others stay
        tx.fq.update_limit(tx.db, "api", max_concurrency=4)
        tx.commit()
    assert _limit_settings(caller, "api") == (4, "10/s", 5)
    with caller.transaction() as tx:
        tx.execute(f"INSERT INTO {ORDERS} (note) VALUES ('before')")
        tx.fq.enqueue(tx.db, "k", channel="acme", limits=["api"])
        # declared by a live job (this transaction's): refused, nothing removed, the transaction goes on
        with pytest.raises(fairqueue.InvalidChannelConfigError, match=r"^shared limit 'api' is declared by 1 live job"):
            tx.fq.remove_limit(tx.db, "api")
        tx.rollback()
    assert caller.orders() == 0
    with caller.transaction() as tx:
        assert tx.fq.remove_limit(tx.db, "api") is True
        tx.rollback()
    assert _limit_settings(caller, "api") == (4, "10/s", 5)
    with caller.transaction() as tx:
        assert tx.fq.remove_limit(tx.db, "api") is True
        assert tx.fq.remove_limit(tx.db, "api") is False
        tx.commit()
    assert _limit_settings(caller, "api") is None


def test_a_job_for_a_full_limit_with_a_line_joins_it_with_the_commit(caller: Caller) -> None:
    """While a limit is full and has a line, every producer call puts its job in that line itself
    (schema fq0027), in the caller's transaction: nothing is there before the commit, and the job
    shows as waiting from the start."""
    fairqueue.configure_limit(caller.conn, "stripe-api", max_concurrency=1)
    fairqueue.enqueue_many(caller.conn, [fairqueue.JobSpec("first", channel="acme", limits=["stripe-api"])] * 2)
    worker = fairqueue.register_worker(caller.conn, "w", lease_seconds=60)
    assert len(fairqueue.claim_batch(caller.conn, worker, 10)) == 1  # one runs, one waits: the line
    with caller.transaction() as tx:
        one = tx.fq.enqueue(tx.db, "one", channel="globex", limits=["stripe-api"])
        [many] = tx.fq.enqueue_many(tx.db, [{"kind": "many", "channel": "globex", "limits": ["stripe-api"]}])
        assert count(caller.conn, "limit_waiting") == 1  # not before the caller commits
        tx.commit()
    lined = caller.conn.execute("SELECT job_id FROM fairqueue.limit_waiting WHERE channel = 'globex'").fetchall()
    assert sorted(lined) == sorted([(one,), (many,)])
    assert count(caller.conn, "scheduled_job") == 0
    for job in (one, many):
        info = fairqueue.get_job(caller.conn, job)
        assert info is not None and info.status == "waiting"
    assert_consistent(caller.conn)
