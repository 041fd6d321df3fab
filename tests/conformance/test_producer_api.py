"""Every producer-side operation behaves the same on every caller kind (see conftest.py): it joins the
caller's transaction, so it takes effect exactly when the caller commits and leaves nothing when the
caller rolls back; bad input raises a clear error, writes nothing and leaves the transaction usable.
Calls go through ``tx.fq``: the sync API for sync kinds, the async one (awaited) for async kinds."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import fairqueue
from fairqueue import Outcome
from tests.conformance.conftest import ORDERS, Caller
from tests.helpers import assert_consistent, count

# -- enqueue ---------------------------------------------------------------------------------------


def test_committed_job_exists_and_can_be_claimed(caller: Caller, worker_of: int) -> None:
    with caller.transaction() as tx:
        job_id = tx.fq.enqueue(tx.db, "email.send", {"to": "a@example.com"}, channel="alice")
        tx.commit()
    [claimed] = fairqueue.claim_batch(caller.conn, worker_of, 10)
    assert (claimed.id, claimed.kind, claimed.args, claimed.channel) == (
        job_id,
        "email.send",
        {"to": "a@example.com"},
        "alice",
    )
    assert claimed.attempt == 1


def test_job_is_invisible_until_commit(caller: Caller, worker_of: int) -> None:
    with caller.transaction() as tx:
        tx.fq.enqueue(tx.db, "k", channel="alice")
        assert fairqueue.claim_batch(caller.conn, worker_of, 10) == []
        tx.commit()
    assert len(fairqueue.claim_batch(caller.conn, worker_of, 10)) == 1


def test_rolled_back_job_never_runs_and_leaves_nothing(caller: Caller, worker_of: int) -> None:
    with caller.transaction() as tx:
        tx.fq.enqueue(tx.db, "k", channel="alice")
        tx.fq.enqueue(tx.db, "k", channel="new-tenant", delay=60)
        tx.fq.enqueue_many(tx.db, [{"kind": "k", "channel": f"c{i}"} for i in range(10)])
        tx.fq.bulk_enqueue(tx.db, [{"kind": "bulk", "channel": f"b{i % 3}"} for i in range(50)])
        tx.rollback()
    assert fairqueue.claim_batch(caller.conn, worker_of, 100) == []
    for table in ("job", "running_job", "scheduled_job", "channel_wakeup"):
        assert count(caller.conn, table) == 0, table


def test_jobs_commit_and_roll_back_with_the_business_rows(caller: Caller) -> None:
    for end in ("rollback", "commit"):
        with caller.transaction() as tx:
            tx.execute(f"INSERT INTO {ORDERS} (note) VALUES (%s)", ("order 42",))
            tx.fq.enqueue(tx.db, "order.confirm", {"total": 42}, channel="shop")
            tx.fq.enqueue_many(tx.db, [fairqueue.JobSpec("order.pack", {"i": i}) for i in range(3)])
            tx.fq.bulk_enqueue(tx.db, [{"kind": "order.mail", "args": {"i": i}} for i in range(5)])
            getattr(tx, end)()
        expected = 0 if end == "rollback" else 1
        assert caller.orders() == expected
        assert count(caller.conn, "job") == 9 * expected
    assert_consistent(caller.conn)


BAD_ARGS = {"when": object()}
BAD_CALLS: dict[str, Callable[[Any, Any], object]] = {
    "enqueue": lambda fq, db: fq.enqueue(db, "k", BAD_ARGS),
    "enqueue_many": lambda fq, db: fq.enqueue_many(db, [{"kind": "k"}, {"kind": "k", "args": BAD_ARGS}]),
    "bulk_enqueue": lambda fq, db: fq.bulk_enqueue(db, [{"kind": "k"}, {"kind": "k", "args": BAD_ARGS}]),
}


@pytest.mark.parametrize("operation", list(BAD_CALLS))
def test_bad_input_writes_nothing_and_the_transaction_goes_on(caller: Caller, operation: str) -> None:
    with caller.transaction() as tx:
        tx.execute(f"INSERT INTO {ORDERS} (note) VALUES ('before')")
        with pytest.raises(fairqueue.InvalidJobError, match="not JSON-serialisable"):
            BAD_CALLS[operation](tx.fq, tx.db)
        assert count(caller.conn, "job") == 0
        tx.fq.enqueue(tx.db, "k", {"fine": True})  # the caller's transaction is still usable
        tx.commit()
    assert caller.orders() == 1 and count(caller.conn, "job") == 1


#: run_at values that are aware datetimes but fall outside the years 1 to 9999 once in UTC
AFTER_9999 = datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-10)))
BEFORE_YEAR_1 = datetime(1, 1, 1, 0, 0, tzinfo=timezone(timedelta(hours=14)))
NOT_A_BIGINT = 2**63

BAD_INPUT: dict[str, tuple[Callable[[Any, Any], object], str]] = {
    "enqueue channel with a newline": (
        lambda fq, db: fq.enqueue(db, "k", channel="evil\nchannel"),
        "channel must not contain control characters",
    ),
    "enqueue_many kind with an escape": (
        lambda fq, db: fq.enqueue_many(db, [{"kind": "k"}, {"kind": "k\x1b[2J"}]),
        "kind must not contain control characters",
    ),
    "bulk_enqueue fifo_key with a C1 control": (
        lambda fq, db: fq.bulk_enqueue(db, [{"kind": "k"}, {"kind": "k", "fifo_key": "f\x9b"}]),
        "fifo_key must not contain control characters",
    ),
    "enqueue run_at after 9999 in UTC": (
        lambda fq, db: fq.enqueue(db, "k", run_at=AFTER_9999),
        "run_at must be from 0001-01-02 to 9999-12-30 in UTC",
    ),
    "enqueue_many run_at before the year 1 in UTC": (
        lambda fq, db: fq.enqueue_many(db, [{"kind": "k"}, {"kind": "k", "run_at": BEFORE_YEAR_1}]),
        "run_at must be from",
    ),
    "bulk_enqueue run_at after 9999 in UTC": (
        lambda fq, db: fq.bulk_enqueue(db, [{"kind": "k"}, {"kind": "k", "run_at": AFTER_9999}]),
        "run_at must be from",
    ),
    "enqueue after a job id past bigint": (
        lambda fq, db: fq.enqueue(db, "k", after=[NOT_A_BIGINT]),
        "after must contain job ids",
    ),
    "enqueue_many after a job id past bigint": (
        lambda fq, db: fq.enqueue_many(db, [{"kind": "k", "after": [1, NOT_A_BIGINT]}]),
        "after must contain job ids",
    ),
    "bulk_enqueue after a job id past bigint": (
        lambda fq, db: fq.bulk_enqueue(db, [{"kind": "k", "after": [NOT_A_BIGINT]}]),
        "after must contain job ids",
    ),
    "get_job of an id past bigint": (lambda fq, db: fq.get_job(db, NOT_A_BIGINT), "job_id must be a whole number"),
    "get_job of an id that is not a number": (
        lambda fq, db: fq.get_job(db, "7"),
        "job_id must be a whole number",
    ),
    "cancel of an id past bigint": (lambda fq, db: fq.cancel(db, NOT_A_BIGINT), "job_id must be a whole number"),
    "retry of an id past bigint": (lambda fq, db: fq.retry(db, NOT_A_BIGINT), "job_id must be a whole number"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_names_times_and_ids_are_refused_before_any_statement(caller: Caller, case: str) -> None:
    """Refused with a clear error, nothing written, and the caller's transaction still usable (a value
    the database refuses, such as a bigint out of range, would have aborted it)."""
    call, message = BAD_INPUT[case]
    with caller.transaction() as tx:
        tx.execute(f"INSERT INTO {ORDERS} (note) VALUES ('before')")
        with pytest.raises(fairqueue.InvalidJobError, match=re.escape(message)):
            call(tx.fq, tx.db)
        tx.fq.enqueue(tx.db, "k", {"fine": True})  # the caller's transaction is still usable
        tx.commit()
    assert caller.orders() == 1 and count(caller.conn, "job") == 1


#: text that holds a backslash followed by u0000: JSON writes it as \\u0000, which is no NUL
NOT_A_NUL = {"path": "C:\\u0000\\x", "pattern": "\\\\u0000", "nested": ["\\u0000"]}


def test_args_with_the_text_of_a_nul_escape_are_stored_as_given(caller: Caller, worker_of: int) -> None:
    with caller.transaction() as tx:
        tx.fq.enqueue(tx.db, "k", NOT_A_NUL, channel="a")
        tx.fq.enqueue_many(tx.db, [{"kind": "k", "args": NOT_A_NUL, "channel": "b"}])
        tx.fq.bulk_enqueue(tx.db, [{"kind": "k", "args": NOT_A_NUL, "channel": "c"}])
        with pytest.raises(fairqueue.InvalidJobError, match="contains a NUL character"):
            tx.fq.enqueue(tx.db, "k", {"path": "C:\\\x00"})  # a backslash, then a real NUL
        tx.commit()
    claimed = fairqueue.claim_batch(caller.conn, worker_of, 10)
    assert [job.args for job in claimed] == [NOT_A_NUL] * 3


def test_a_unique_key_held_in_the_transaction_returns_the_same_job(caller: Caller) -> None:
    with caller.transaction() as tx:
        first = tx.fq.enqueue(tx.db, "k", unique_key="invoice-7")
        assert tx.fq.enqueue(tx.db, "k", unique_key="invoice-7") == first
        with pytest.raises(fairqueue.DuplicateJobError):
            tx.fq.enqueue(tx.db, "k", unique_key="invoice-7", on_duplicate="raise")
        tx.commit()
    assert count(caller.conn, "job") == 1


# -- reading and changing jobs -----------------------------------------------------------------------


def test_get_job_sees_the_transactions_own_job_and_others_see_it_at_commit(caller: Caller) -> None:
    with caller.transaction() as tx:
        job_id = tx.fq.enqueue(tx.db, "k", {"n": 1}, channel="alice")
        mine = tx.fq.get_job(tx.db, job_id)
        assert mine is not None and (mine.status, mine.args, mine.channel) == ("ready", {"n": 1}, "alice")
        assert fairqueue.get_job(caller.conn, job_id) is None
        tx.commit()
    theirs = fairqueue.get_job(caller.conn, job_id)
    assert theirs is not None and theirs.status == "ready"


def test_cancel_takes_effect_with_the_commit(caller: Caller, worker_of: int) -> None:
    job_id = fairqueue.enqueue(caller.conn, "k", channel="alice")
    with caller.transaction() as tx:
        assert tx.fq.cancel(tx.db, job_id) == "cancelled"
        tx.rollback()
    info = fairqueue.get_job(caller.conn, job_id)
    assert info is not None and info.status == "ready"
    with caller.transaction() as tx:
        assert tx.fq.cancel(tx.db, job_id) == "cancelled"
        tx.commit()
    info = fairqueue.get_job(caller.conn, job_id)
    assert info is not None and info.status == "cancelled"
    assert fairqueue.claim_batch(caller.conn, worker_of, 10) == []


def test_retry_takes_effect_with_the_commit(caller: Caller, worker_of: int) -> None:
    job_id = fairqueue.enqueue(caller.conn, "k", channel="alice", max_attempts=1)
    [claimed] = fairqueue.claim_batch(caller.conn, worker_of, 1)
    fairqueue.fail(caller.conn, worker_of, claimed.id, error="boom")
    with caller.transaction() as tx:
        assert tx.fq.retry(tx.db, job_id) == "retried"
        tx.rollback()
    info = fairqueue.get_job(caller.conn, job_id)
    assert info is not None and info.status == "failed"
    with caller.transaction() as tx:
        assert tx.fq.retry(tx.db, job_id) == "retried"
        tx.commit()
    [again] = fairqueue.claim_batch(caller.conn, worker_of, 1)
    assert again.id == job_id and again.attempt == 2


# -- channels ------------------------------------------------------------------------------------------


def _settings(caller: Caller, name: str) -> tuple[Any, ...] | None:
    return caller.conn.execute(
        "SELECT max_concurrency, rate_limit, weight, paused FROM fairqueue.channel WHERE name = %s", (name,)
    ).fetchone()


def test_configure_channel_takes_effect_with_the_commit(caller: Caller) -> None:
    with caller.transaction() as tx:
        tx.fq.configure_channel(tx.db, "acme", max_concurrency=2, rate_limit="10/s", weight=3)
        tx.rollback()
    assert _settings(caller, "acme") is None
    with caller.transaction() as tx:
        tx.fq.configure_channel(tx.db, "acme", max_concurrency=2, rate_limit="10/s", weight=3)
        tx.commit()
    assert _settings(caller, "acme") == (2, "10/s", 3, False)


def test_bad_channel_settings_write_nothing_and_the_transaction_goes_on(caller: Caller) -> None:
    with caller.transaction() as tx:
        with pytest.raises(fairqueue.InvalidChannelConfigError):
            tx.fq.configure_channel(tx.db, "acme", max_concurrency=0)
        tx.fq.configure_channel(tx.db, "acme", weight=2)
        tx.commit()
    assert _settings(caller, "acme") == (None, None, 2, False)


def test_update_channel_changes_only_what_it_is_given_with_the_commit(caller: Caller) -> None:
    fairqueue.configure_channel(caller.conn, "acme", max_concurrency=2, rate_limit="10/s", weight=3)
    with caller.transaction() as tx:
        assert tx.fq.update_channel(tx.db, "acme", paused=True).paused
        tx.rollback()
    assert _settings(caller, "acme") == (2, "10/s", 3, False)
    with caller.transaction() as tx:
        after = tx.fq.update_channel(tx.db, "acme", paused=True, max_concurrency=None)
        tx.commit()
    assert (after.max_concurrency, after.rate_limit, after.weight, after.paused) == (None, "10/s", 3, True)
    assert _settings(caller, "acme") == (None, "10/s", 3, True)


def test_a_bad_update_writes_nothing_and_the_transaction_goes_on(caller: Caller) -> None:
    with caller.transaction() as tx:
        with pytest.raises(fairqueue.InvalidChannelConfigError):
            tx.fq.update_channel(tx.db, "acme", weight=0)
        tx.fq.update_channel(tx.db, "acme", weight=2)
        tx.commit()
    assert _settings(caller, "acme") == (None, None, 2, False)


# -- a handler's transactional completion -----------------------------------------------------------


def test_a_completion_commits_with_the_handlers_writes_or_not_at_all(caller: Caller, worker_of: int) -> None:
    if caller.is_async:
        pytest.skip("worker side: async handlers get the worker's own AsyncConnection (ctx.async_connection())")
    job_id = fairqueue.enqueue(caller.conn, "order.ship", channel="shop")
    [claimed] = fairqueue.claim_batch(caller.conn, worker_of, 1)
    done = [Outcome(claimed.id, "succeeded", result={"shipped": True})]
    with caller.transaction() as tx:
        tx.execute(f"INSERT INTO {ORDERS} (note) VALUES ('shipped')")
        assert [f.job_id for f in tx.fq.finish(tx.db, worker_of, done)] == [job_id]
        tx.rollback()
    info = fairqueue.get_job(caller.conn, job_id)
    assert info is not None and info.status == "running" and caller.orders() == 0
    with caller.transaction() as tx:
        tx.execute(f"INSERT INTO {ORDERS} (note) VALUES ('shipped')")
        tx.fq.finish(tx.db, worker_of, done)
        tx.commit()
    info = fairqueue.get_job(caller.conn, job_id)
    assert info is not None and (info.status, info.result) == ("succeeded", {"shipped": True})
    assert caller.orders() == 1


# -- keys belong to their channel (tenant isolation) ---------------------------------------------------


ENQUEUE_WITH_KEY: dict[str, Callable[..., int]] = {
    "enqueue": lambda fq, db, channel, **key: fq.enqueue(db, "k", {"by": channel}, channel=channel, **key),
    "enqueue_many": lambda fq, db, channel, **key: fq.enqueue_many(
        db, [{"kind": "k", "args": {"by": channel}, "channel": channel, **key}]
    )[0],
    "bulk_enqueue": lambda fq, db, channel, **key: (
        fq.bulk_enqueue(db, [{"kind": "k", "args": {"by": channel}, "channel": channel, **key}]).created
    ),
}


@pytest.mark.parametrize("operation", list(ENQUEUE_WITH_KEY))
def test_the_same_unique_key_in_two_channels_is_two_jobs(caller: Caller, operation: str) -> None:
    enqueue = ENQUEUE_WITH_KEY[operation]
    with caller.transaction() as tx:
        alice = enqueue(tx.fq, tx.db, "alice", unique_key="invoice-1")
        bob = enqueue(tx.fq, tx.db, "bob", unique_key="invoice-1")  # Bob's key, not Alice's job
        again = enqueue(tx.fq, tx.db, "alice", unique_key="invoice-1")  # within a channel the key still holds
        tx.commit()
    rows = caller.conn.execute("SELECT channel, args->>'by' FROM fairqueue.job ORDER BY id").fetchall()
    assert rows == [("alice", "alice"), ("bob", "bob")]
    if operation == "bulk_enqueue":  # counts: each created one job, the repeat none
        assert (alice, bob, again) == (1, 1, 0)
    else:
        assert alice != bob and again == alice


@pytest.mark.parametrize("operation", list(ENQUEUE_WITH_KEY))
def test_a_fifo_key_of_one_channel_does_not_hold_back_another_channels_job(
    caller: Caller, worker_of: int, operation: str
) -> None:
    enqueue = ENQUEUE_WITH_KEY[operation]
    with caller.transaction() as tx:
        enqueue(tx.fq, tx.db, "alice", fifo_key="account-9")
        enqueue(tx.fq, tx.db, "alice", fifo_key="account-9")  # waits behind Alice's first
        enqueue(tx.fq, tx.db, "bob", fifo_key="account-9")  # Bob's own key: runs beside Alice's
        tx.commit()
    claimed = fairqueue.claim_batch(caller.conn, worker_of, 10)
    assert sorted((j.channel, j.args["by"]) for j in claimed) == [("alice", "alice"), ("bob", "bob")]
    waiting = caller.conn.execute("SELECT channel, fifo_key FROM fairqueue.fifo_waiting").fetchall()
    assert waiting == [("alice", "account-9")]
