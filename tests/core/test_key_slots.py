"""Fair keys by slots (fq0025, schema/35_fair_keys.sql): in a channel without a cap per key, each ready
keyed job carries its key's turn (running_job.key_slot) and a claim takes the channel's share in slot
order, with no row per key. Each test here fails without the mechanism it names."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import Outcome
from tests.conftest import Connections
from tests.helpers import (
    ISOLATIONS,
    assert_consistent,
    claimed_kinds,
    enqueue_keyed,
    enqueue_keyed_many,
    in_thread,
    key_rows,
    wait_until_blocked_or_done,
)


def _one_at_a_time(db: psycopg.Connection[Any], worker: int, n: int) -> list[str]:
    return [k for _ in range(n) for k in claimed_kinds(db, worker, 1)]


def _key_wakeups(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM fairqueue.channel_wakeup WHERE fair_key IS NOT NULL").fetchone()
    assert row is not None
    return int(row[0])


def test_a_claim_over_keys_without_a_cap_keeps_no_row_per_key(conn: psycopg.Connection[Any], worker: int) -> None:
    """The keys of a channel without a cap per key take turns by their jobs' slots: none has a row (the
    intake that makes the channel keyed writes none)."""
    fairqueue.configure_channel(conn, "acme", weight=2)
    enqueue_keyed_many(conn, "acme", ["bulk"] * 50 + [f"user-{i}" for i in range(5)])
    assert Counter(k.fair_key for k in fairqueue.claim_batch(conn, worker, 6)) == {
        "bulk": 1,
        **{f"user-{i}": 1 for i in range(5)},
    }
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_key").fetchone() == (0,)
    assert conn.execute("SELECT keyed FROM fairqueue.channel WHERE name = 'acme'").fetchone() == (True,)
    assert_consistent(conn)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_job_of_a_new_key_in_a_keyed_active_channel_needs_no_wakeup_under_read_committed(
    connect: Connections, conn: psycopg.Connection[Any], worker: int, isolation: str
) -> None:
    """Under READ COMMITTED a producer finds the channel active and slotted (channel_active.slotted,
    under the channel's lock held shared) and writes the job alone, whatever its key; under
    REPEATABLE READ and SERIALIZABLE it leaves one wakeup per key, as before. The claims take it."""
    enqueue_keyed_many(conn, "acme", ["a"] * 3)
    fairqueue.claim_batch(conn, worker, 1)
    assert _key_wakeups(conn) == 0
    producer = connect(autocommit=False, isolation=isolation)
    new = enqueue_keyed(producer, "new", "acme", "brand-new")
    producer.commit()
    assert _key_wakeups(conn) == (0 if isolation == "read committed" else 1)
    assert "new" in claimed_kinds(conn, worker, 2)
    assert_consistent(conn)
    assert new


def test_adding_a_cap_per_key_waits_for_a_producer_that_found_the_channel_slotted(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """A producer that found the channel slotted left no wakeup for its key. configure_channel gaining
    a cap per key builds the keys' rows from the ready jobs, so it waits for that producer (the
    channel's lock, exclusively), and the key gets its row and its turn."""
    enqueue_keyed_many(conn, "acme", ["a"] * 3)
    fairqueue.claim_batch(conn, worker, 1)
    producer = connect(autocommit=False)
    late = enqueue_keyed(producer, "late", "acme", "late-key")
    assert _key_wakeups(conn) == 0
    configurer = connect()
    pid = configurer.info.backend_pid
    t, errors = in_thread(lambda: fairqueue.configure_channel(configurer, "acme", key_max_concurrency=5))
    assert wait_until_blocked_or_done(conn, t, pid=pid, or_retrying=True), (
        "configure_channel did not wait for the open producer"
    )
    # it waits without queueing for the lock: another producer of the channel is not held up meanwhile
    other = connect(autocommit=False)
    other_job = enqueue_keyed(other, "other", "acme", "other-key")
    other.commit()
    assert t.is_alive()
    producer.commit()
    t.join()
    assert not errors
    assert conn.execute(
        "SELECT in_turn FROM fairqueue.channel_key WHERE channel = 'acme' AND fair_key = 'late-key'"
    ).fetchone() == (True,)
    assert_consistent(conn)
    assert {late, other_job} <= {j.id for j in fairqueue.claim_batch(conn, worker, 10)}


def test_changing_the_cap_per_key_gives_up_after_lock_timeout_and_changes_nothing(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """While a producer of the channel stays in flight, configure_channel changing the cap per key tries
    for the channel's lock until lock_timeout (at most 30 s), then fails with a clear message and leaves
    the channel as it was; once the producer has committed, the same call goes through."""
    enqueue_keyed_many(conn, "acme", ["a"] * 3)
    fairqueue.claim_batch(conn, worker, 1)
    settings = "SELECT key_max_concurrency, keyed FROM fairqueue.channel WHERE name = 'acme'"
    before = conn.execute(settings).fetchone(), key_rows(conn)
    producer = connect(autocommit=False)
    late = enqueue_keyed(producer, "late", "acme", "late-key")
    configurer = connect(autocommit=False)
    configurer.execute("SET lock_timeout = '200ms'")
    t0 = time.monotonic()
    with pytest.raises(psycopg.errors.LockNotAvailable, match="still has transactions enqueueing into it"):
        fairqueue.configure_channel(configurer, "acme", key_max_concurrency=5)
    assert time.monotonic() - t0 < 15, "it waited past lock_timeout (for its 30 s at most)"
    configurer.rollback()
    assert (conn.execute(settings).fetchone(), key_rows(conn)) == before
    producer.commit()
    fairqueue.configure_channel(configurer, "acme", key_max_concurrency=5)
    configurer.commit()
    assert conn.execute(settings).fetchone() == (5, True)
    assert_consistent(conn)
    assert late in {j.id for j in fairqueue.claim_batch(conn, worker, 10)}


def test_the_channel_keeps_being_served_while_a_cap_per_key_waits_for_its_producers(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """configure_channel tries for the channel's lock (its producers in flight) before it takes the
    channel's row: the claims serve the channel meanwhile, under its old settings, and the cap per key
    then counts the jobs they started. Holding the row through the wait (up to 30 s) stalled the
    channel: every claim skips a row another transaction holds."""
    enqueue_keyed_many(conn, "acme", ["a", "a", "b", "b", "c"])
    fairqueue.claim_batch(conn, worker, 1)
    producer = connect(autocommit=False)
    late = enqueue_keyed(producer, "late", "acme", "a")
    configurer = connect()
    pid = configurer.info.backend_pid
    t, errors = in_thread(lambda: fairqueue.configure_channel(configurer, "acme", key_max_concurrency=2))
    assert wait_until_blocked_or_done(conn, t, pid=pid, or_retrying=True), "configure_channel did not wait"
    served = fairqueue.claim_batch(conn, worker, 10)
    assert t.is_alive()
    assert len(served) == 4, "the channel was not served while configure_channel waited for its producer"
    producer.commit()
    t.join()
    assert not errors
    assert conn.execute("SELECT key_max_concurrency FROM fairqueue.channel WHERE name = 'acme'").fetchone() == (2,)
    assert conn.execute(
        "SELECT fair_key, running, in_turn FROM fairqueue.channel_key WHERE channel = 'acme' ORDER BY fair_key"
    ).fetchall() == [("a", 2, True), ("b", 2, False), ("c", 1, False)]
    assert_consistent(conn)
    assert fairqueue.claim_batch(conn, worker, 10) == []  # a is at its cap: late waits for a slot
    assert conn.execute("SELECT job_id FROM fairqueue.running_job WHERE worker_id IS NULL").fetchall() == [(late,)]


def test_losing_the_cap_per_key_gives_the_keys_slots_afresh_from_the_frontier(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    """Under a cap per key, jobs are taken by key rows, and one key may have given more than another:
    their slots no longer say whose turn is next. Losing the cap renumbers them from the frontier, so
    the keys alternate again (without it, a, held at its cap, would take the next turns alone)."""
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=1)
    enqueue_keyed_many(conn, "acme", ["a"] * 5, kind="a")
    enqueue_keyed_many(conn, "acme", ["b"] * 5, kind="b")
    first = fairqueue.claim_batch(conn, worker, 2)
    assert sorted(j.kind for j in first) == ["a", "b"]
    for _ in range(2):  # b runs two more jobs while a stays at its cap
        [b] = [j for j in first if j.kind == "b"] if first else []
        fairqueue.finish(conn, worker, [Outcome(b.id)])
        first = fairqueue.claim_batch(conn, worker, 2)
        assert [j.kind for j in first] == ["b"]
    fairqueue.configure_channel(conn, "acme")
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_key").fetchone() == (0,)
    assert Counter(claimed_kinds(conn, worker, 4)) == {"a": 2, "b": 2}
    assert_consistent(conn)


def test_a_higher_priority_job_takes_its_keys_next_turn_and_hands_its_slot_on(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    """A job ahead of its key's order (key_jump) goes in its key's next turn, and the job whose turn it
    took moves to the slot it leaves: the key keeps one turn per job, no more (without the hand-over it
    would have two turns at one slot) and no fewer."""
    enqueue_keyed_many(conn, "acme", ["a"] * 3, kind="a")
    enqueue_keyed_many(conn, "acme", ["b"] * 3, kind="b")
    enqueue_keyed(conn, "a-urgent", "acme", "a", priority=10)
    order = _one_at_a_time(conn, worker, 7)
    assert order == ["a-urgent", "b", "a", "b", "a", "b", "a"]
    assert_consistent(conn)


def test_a_job_handed_back_goes_first_in_its_keys_next_turn(conn: psycopg.Connection[Any], worker: int) -> None:
    """release makes a job ready again, behind its key's last slot but ahead of its key's jobs in
    enqueue order: it takes the key's next turn."""
    enqueue_keyed_many(conn, "acme", ["a"] * 3, kind="a")
    enqueue_keyed_many(conn, "acme", ["b"] * 3, kind="b")
    [first] = fairqueue.claim_batch(conn, worker, 1)
    assert fairqueue.release(conn, worker, [first.id]) == 1
    taken = [j for _ in range(6) for j in fairqueue.claim_batch(conn, worker, 1)]
    assert [j.fair_key for j in taken] in (["b", "a"] * 3, ["a", "b"] * 3)
    assert next(j.id for j in taken if j.fair_key == first.fair_key) == first.id
    assert_consistent(conn)


def test_jobs_without_a_key_bank_no_turns_while_the_keys_run_dry(conn: psycopg.Connection[Any], worker: int) -> None:
    """The turn '' of a keyed channel's jobs without a key stays within one turn of the keys' frontier.
    Here it runs alone for a while (its slot climbs), the keys run dry, and a new key joins at slot 0:
    the two alternate (without the bound, the new key would take a turn for every one '' took alone)."""
    enqueue_keyed(conn, "a", "acme", "a")
    enqueue_keyed_many(conn, "acme", [None] * 30, kind="plain")
    assert Counter(claimed_kinds(conn, worker, 11)) == {"a": 1, "plain": 10}
    enqueue_keyed_many(conn, "acme", ["b"] * 10, kind="b")
    assert Counter(claimed_kinds(conn, worker, 4)) == {"b": 2, "plain": 2}
    assert_consistent(conn)


def test_a_key_that_joins_starts_at_the_frontier_not_at_the_first_slot(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    """A key with no ready job joins at the lowest slot ready in its channel: it neither waits behind
    every turn the keys already there hold, nor takes the turns they already had."""
    enqueue_keyed_many(conn, "acme", ["a"] * 20, kind="a")
    enqueue_keyed_many(conn, "acme", ["b"] * 20, kind="b")
    assert Counter(claimed_kinds(conn, worker, 20)) == {"a": 10, "b": 10}
    enqueue_keyed(conn, "c", "acme", "c")
    assert "c" in claimed_kinds(conn, worker, 3)
    enqueue_keyed_many(conn, "acme", ["d"] * 20, kind="d")
    assert Counter(claimed_kinds(conn, worker, 9)) == {"a": 3, "b": 3, "d": 3}
    assert_consistent(conn)


def test_a_job_after_one_out_of_order_takes_the_slot_after_it(conn: psycopg.Connection[Any], worker: int) -> None:
    """A key's last slot is the later of its last job's (by priority, then enqueue order) and its jobs
    out of order's: a job added after a higher-priority one takes the slot after both, so the key
    keeps one turn per job (without it, the two would share a slot and the key take two turns in a
    row)."""
    enqueue_keyed_many(conn, "acme", ["a"] * 2, kind="a")
    enqueue_keyed(conn, "a", "acme", "a", priority=10)
    enqueue_keyed(conn, "a", "acme", "a")
    enqueue_keyed_many(conn, "acme", ["b"] * 4, kind="b")
    order = _one_at_a_time(conn, worker, 8)
    assert order in (["a", "b"] * 4, ["b", "a"] * 4)
    assert_consistent(conn)
