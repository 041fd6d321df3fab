"""Fair keys: turns within a channel's turn (invariant 14 of docs/design.md).

Channels take turns as before; within a channel's turn its jobs take turns across their fair keys
(priority orders a key's own jobs). A channel's share of the workers does not depend on how many keys
it uses. Keys enter the turns through wakeups (producers never write channel_key) and leave them when
a claim finds them empty; no key is ever left out with ready jobs."""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import Outcome
from tests.conftest import Connections
from tests.helpers import assert_consistent, claimed_kinds, drain, enqueue_keyed, enqueue_keyed_many, key_rows


def _keys_in_turn(db: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    return key_rows(db)


def test_a_one_job_key_goes_next_while_another_key_of_the_channel_floods(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    enqueue_keyed_many(conn, "acme", ["import"] * 50, kind="import")
    assert len(fairqueue.claim_batch(conn, worker, 3)) == 3  # the import is under way
    enqueue_keyed(conn, "alice", "acme", "alice")
    # within one turn of the channel: the next claim of two takes the import's next job and alice's
    assert sorted(claimed_kinds(conn, worker, 2)) == ["alice", "import"]


def test_keys_alternate_within_a_batch_and_one_at_a_time(conn: psycopg.Connection[Any], worker: int) -> None:
    enqueue_keyed_many(conn, "acme", ["a"] * 4, kind="a")
    enqueue_keyed_many(conn, "acme", ["b"] * 4, kind="b")
    batch = claimed_kinds(conn, worker, 4)
    assert Counter(batch) == {"a": 2, "b": 2}
    singles = [claimed_kinds(conn, worker, 1) for _ in range(5)]
    assert Counter(k for s in singles for k in s) == {"a": 2, "b": 2}
    assert singles[-1] == []
    assert singles[0] != singles[1]  # they take turns, not runs


def test_a_channel_with_a_thousand_keys_gets_the_same_share_as_a_channel_with_one(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    # (the keys' wakeups come last: a claim takes in 1,000 wakeups at most, and 1,000 keys enqueued
    # first would keep the other tenants out of the first claim, docs/design.md "Costs")
    enqueue_keyed_many(conn, "one", ["only"] * 1000, kind="one")
    enqueue_keyed_many(conn, "none", [None] * 1000, kind="none")
    enqueue_keyed_many(conn, "many", [f"user-{i}" for i in range(1000)], kind="many")
    taken: Counter[str] = Counter()
    for _ in range(20):
        taken.update(claimed_kinds(conn, worker, 30))
    assert sum(taken.values()) == 600
    assert taken == {"many": 200, "one": 200, "none": 200}


def test_priority_orders_the_jobs_of_a_key_and_never_takes_another_keys_turn(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    enqueue_keyed(conn, "a-low", "acme", "a", priority=-5)
    enqueue_keyed(conn, "a-high", "acme", "a", priority=50)
    enqueue_keyed(conn, "b-1", "acme", "b")
    enqueue_keyed(conn, "b-2", "acme", "b")
    enqueue_keyed(conn, "a-urgent", "acme", "a", priority=100)
    order = [k for _ in range(5) for k in claimed_kinds(conn, worker, 1)]
    assert [k for k in order if k.startswith("a")] == ["a-urgent", "a-high", "a-low"]
    assert [k for k in order if k.startswith("b")] == ["b-1", "b-2"]
    assert order[:2] in (["a-urgent", "b-1"], ["b-1", "a-urgent"])  # a's priorities did not take b's turn


def test_jobs_without_a_key_take_turns_as_one_more_key(conn: psycopg.Connection[Any], worker: int) -> None:
    enqueue_keyed_many(conn, "acme", [None] * 10, kind="plain")
    enqueue_keyed_many(conn, "acme", ["a"] * 10, kind="a")
    enqueue_keyed_many(conn, "acme", ["b"] * 10, kind="b")
    assert Counter(claimed_kinds(conn, worker, 9)) == {"plain": 3, "a": 3, "b": 3}


def test_a_key_that_runs_dry_leaves_the_turns_and_an_idle_channel_keeps_none(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    enqueue_keyed_many(conn, "acme", ["a", "b", "b", "b"])
    assert len(fairqueue.claim_batch(conn, worker, 2)) == 2  # a and b
    fairqueue.claim_batch(conn, worker, 1)
    assert _keys_in_turn(conn) == [("acme", "b")]  # a ran dry
    drain(conn, worker)
    assert _keys_in_turn(conn) == []
    assert conn.execute("SELECT active, keyed FROM fairqueue.channel WHERE name = 'acme'").fetchone() == (False, False)
    # and it comes back at the current turn
    enqueue_keyed(conn, "again", "acme", "a")
    assert claimed_kinds(conn, worker, 5) == ["again"]
    assert_consistent(conn)


def test_a_key_woken_while_its_channel_is_busy_joins_at_the_current_turn(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    enqueue_keyed_many(conn, "acme", ["a"] * 30 + ["b"] * 30)
    for _ in range(10):
        fairqueue.claim_batch(conn, worker, 2)  # a and b have had 10 turns each
    enqueue_keyed_many(conn, "acme", ["c"] * 5, kind="c")
    kinds = claimed_kinds(conn, worker, 6)
    assert kinds.count("c") == 2  # no credit for the turns it was not there, and no wait behind them


def test_the_key_survives_a_retry_a_release_a_delay_and_an_operators_retry(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    failing = enqueue_keyed(conn, "failing", "acme", "a")
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 1)] == [failing]
    fairqueue.finish(conn, worker, [Outcome(failing, "failed", error="boom", retry_in=0)])
    enqueue_keyed_many(conn, "acme", ["b"] * 5, kind="b")
    kinds = claimed_kinds(conn, worker, 2)
    assert sorted(kinds) == ["b", "failing"]  # the retry took its key's turn again
    assert conn.execute("SELECT fair_key FROM fairqueue.running_job WHERE job_id = %s", (failing,)).fetchone() == ("a",)
    released = fairqueue.claim_batch(conn, worker, 1)
    assert fairqueue.release(conn, worker, [j.id for j in released]) == 1
    assert_consistent(conn)
    fairqueue.finish(conn, worker, [Outcome(failing, "failed", error="final")])
    assert conn.execute(
        "SELECT fair_key FROM fairqueue.completed_job WHERE job_id = %s AND final", (failing,)
    ).fetchone() == ("a",)
    assert fairqueue.retry(conn, failing) == "retried"
    drain(conn, worker)
    assert conn.execute(
        "SELECT count(*) FROM fairqueue.completed_job WHERE job_id = %s AND fair_key = 'a'", (failing,)
    ).fetchone() == (3,)
    delayed = conn.execute(
        "SELECT job_id FROM fairqueue.enqueue('later', '{}'::jsonb, 'acme', now() + interval '1 hour',"
        " p_fair_key => 'a')"
    ).fetchone()
    assert delayed is not None
    conn.execute("UPDATE fairqueue.scheduled_job SET run_at = now() WHERE job_id = %s", (delayed[0],))
    assert claimed_kinds(conn, worker, 1) == ["later"]
    assert_consistent(conn)


def test_a_fifo_key_and_a_dependency_keep_the_fair_key(conn: psycopg.Connection[Any], worker: int) -> None:
    first = conn.execute(
        "SELECT job_id FROM fairqueue.enqueue('first', '{}'::jsonb, 'acme', p_fifo_key => 'f', p_fair_key => 'a')"
    ).fetchone()
    conn.execute("SELECT fairqueue.enqueue('second', '{}'::jsonb, 'acme', p_fifo_key => 'f', p_fair_key => 'a')")
    assert first is not None
    conn.execute(
        "SELECT fairqueue.enqueue('after', '{}'::jsonb, 'acme', p_depends_on => %s, p_fair_key => 'b')", ([first[0]],)
    )
    order = [j.kind for j in drain(conn, worker)]
    assert order == ["first", "second", "after"] or order == ["first", "after", "second"]
    assert conn.execute("SELECT DISTINCT fair_key FROM fairqueue.completed_job ORDER BY 1").fetchall() == [
        ("a",),
        ("b",),
    ]
    assert _keys_in_turn(conn) == []


def test_a_channels_cap_and_weight_hold_for_the_channel_as_a_whole(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_channel(conn, "capped", max_concurrency=3)
    enqueue_keyed_many(conn, "capped", [f"u{i}" for i in range(20)], kind="capped")
    fairqueue.configure_channel(conn, "heavy", weight=2)
    enqueue_keyed_many(conn, "heavy", [f"u{i}" for i in range(100)], kind="heavy")
    enqueue_keyed_many(conn, "light", ["x"] * 100, kind="light")
    taken = Counter(claimed_kinds(conn, worker, 30))
    assert taken["capped"] == 3
    assert taken["heavy"] == 2 * taken["light"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("", "fair_key must be a non-empty string"),
        ("x" * 256, "at most 255"),
        ("a\nb", "fair_key must not contain control characters"),
    ],
)
def test_bad_fair_keys_are_refused_and_nothing_is_written(
    conn: psycopg.Connection[Any], bad: str, message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        enqueue_keyed(conn, "k", "acme", bad)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        enqueue_keyed_many(conn, "acme", ["ok", bad])
    assert conn.execute("SELECT count(*) FROM fairqueue.job").fetchone() == (0,)


def test_several_workers_and_producers_keep_both_levels_fair_and_strand_no_key(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """Three claimers and two producers, one job per producer transaction, keys coming and going: every
    job is claimed exactly once, no key is left out of the turns with ready jobs, and nothing remains."""
    per_producer, producers, claimers = 300, 2, 3
    start = threading.Barrier(producers + claimers)
    produced = threading.Event()
    claimed: list[int] = []
    lock = threading.Lock()
    workers = [fairqueue.register_worker(conn, f"w{i}", lease_seconds=600) for i in range(claimers)]

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        db = connect()
        start.wait()
        for _ in range(per_producer):
            key = rng.choice([None, *(f"u{i}" for i in range(8))])
            enqueue_keyed(db, "k", f"c{rng.randrange(4)}", key, priority=rng.choice([0, 0, 5]))

    def claim(worker_id: int) -> None:
        db = connect()
        start.wait()
        empty_after_production = 0
        while empty_after_production < 50:
            jobs = fairqueue.claim_batch(db, worker_id, 4)
            if jobs:
                fairqueue.finish(db, worker_id, [Outcome(j.id) for j in jobs])
                with lock:
                    claimed.extend(j.id for j in jobs)
            elif produced.is_set():
                empty_after_production += 1

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
    threads += [threading.Thread(target=claim, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads[:producers]:
        t.join()
    produced.set()
    for t in threads[producers:]:
        t.join()
    assert len(claimed) == len(set(claimed)) == producers * per_producer
    assert conn.execute("SELECT count(*) FROM fairqueue.job").fetchone() == (0,)
    assert _keys_in_turn(conn) == []
    assert_consistent(conn)


def test_several_workers_share_a_flooded_tenant_and_a_many_keyed_one_equally(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """Two tenants flood the queue, one with a single key and one with 1,000; two workers claim in
    parallel (a barrier starts each round together). Each round serves each tenant once, whichever
    worker gets there first: the same share for both."""
    enqueue_keyed_many(conn, "one", ["only"] * 600, kind="one")
    enqueue_keyed_many(conn, "many", [f"user-{i}" for i in range(1000)], kind="many")
    while conn.execute(
        "SELECT fairqueue.promote_due_jobs(), EXISTS (SELECT 1 FROM fairqueue.channel_wakeup)"
    ).fetchone() != (
        False,
        False,
    ):
        pass  # every key in turn first (an intake takes 1,000 wakeups at a time): the shares are the point here
    workers = [fairqueue.register_worker(conn, f"w{i}", lease_seconds=600) for i in range(2)]
    rounds = 10
    barrier = threading.Barrier(2)
    taken: Counter[str] = Counter()
    lock = threading.Lock()

    def claim(worker_id: int) -> None:
        db = connect()
        for _ in range(rounds):
            barrier.wait()
            jobs = fairqueue.claim_batch(db, worker_id, 10)
            with lock:
                taken.update(j.kind for j in jobs)
            barrier.wait()
            fairqueue.finish(db, worker_id, [Outcome(j.id) for j in jobs])

    threads = [threading.Thread(target=claim, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert taken == {"one": 100, "many": 100}
    assert_consistent(conn)


def test_a_key_whose_ready_job_is_locked_elsewhere_stays_in_turn(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """A claim that finds a key's only ready job locked (SKIP LOCKED) gets nothing from it, and must not
    take the key out of the turns: a fresh look still finds the job ready."""
    job = enqueue_keyed(conn, "locked", "acme", "a")
    enqueue_keyed(conn, "other", "acme", "b")
    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM fairqueue.running_job WHERE job_id = %s FOR UPDATE", (job,))
    assert claimed_kinds(conn, worker, 5) == ["other"]
    holder.rollback()
    assert ("acme", "a") in _keys_in_turn(conn)
    assert_consistent(conn)
    assert claimed_kinds(conn, worker, 5) == ["locked"]


def test_a_key_woken_while_its_channel_is_held_stays_woken(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """The intake puts keys in turn only under their channel's row; a channel another transaction holds
    keeps its keys' wakeups for a later intake."""
    enqueue_keyed(conn, "first", "acme", "a")
    assert claimed_kinds(conn, worker, 1) == ["first"]  # acme exists, idle
    enqueue_keyed(conn, "second", "acme", "b")
    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM fairqueue.channel WHERE name = 'acme' FOR NO KEY UPDATE")
    conn.execute("SELECT fairqueue.promote_due_jobs()")  # the intake skips acme
    assert conn.execute(
        "SELECT count(*) FROM fairqueue.channel_wakeup WHERE channel = 'acme' AND fair_key = 'b'"
    ).fetchone() == (1,)
    holder.rollback()
    assert_consistent(conn)
    assert claimed_kinds(conn, worker, 5) == ["second"]


def test_a_key_that_took_more_of_a_batch_waits_for_the_others_to_catch_up(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    enqueue_keyed_many(conn, "acme", ["a"] * 10, kind="a")
    enqueue_keyed_many(conn, "acme", ["b"] * 10, kind="b")
    first = Counter(claimed_kinds(conn, worker, 3))
    assert sorted(first.values()) == [1, 2]
    behind = min(first, key=lambda k: first[k])
    assert claimed_kinds(conn, worker, 1) == [behind]  # the key that got one of three goes next


def test_a_released_job_of_a_key_no_longer_in_turn_is_claimed_again(conn: psycopg.Connection[Any], worker: int) -> None:
    job = enqueue_keyed(conn, "only", "acme", "a")
    enqueue_keyed_many(conn, "acme", ["b"] * 5, kind="b")
    assert sorted(claimed_kinds(conn, worker, 2)) == ["b", "only"]
    assert claimed_kinds(conn, worker, 2) == ["b", "b"]
    assert ("acme", "a") not in _keys_in_turn(conn)  # its key ran dry: the last claim found it empty
    assert fairqueue.release(conn, worker, [job]) == 1
    assert_consistent(conn)
    assert "only" in claimed_kinds(conn, worker, 2)


def test_a_claimed_job_knows_its_fair_key(conn: psycopg.Connection[Any], worker: int) -> None:
    enqueue_keyed(conn, "keyed", "acme", "user-42")
    enqueue_keyed(conn, "plain", "acme", None)
    assert {j.kind: j.fair_key for j in fairqueue.claim_batch(conn, worker, 5)} == {
        "keyed": "user-42",
        "plain": None,
    }
