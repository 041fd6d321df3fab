"""Invariant 13 for claims: the fair order's scans begin at a floor (schema/15_vtime_floor.sql).

Every claim writes a new version of the channel rows it serves, and each adds an entry to
channel_eligible_idx; while a snapshot is held none can be removed, and a scan from the lowest
virtual time would walk them all. The scans begin at a floor instead, which needs two guarantees,
each tested here with the mechanism that gives it: no channel becomes eligible below the floor (the
trigger that clamps its virtual time), and the floor does not rise past a channel that a transaction
still open is making eligible (the floor waits for the transactions older than its proposal).

Reads are counted with PostgreSQL's per-transaction counters (index entries stepped on), not timed.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import psycopg
import pytest

import fairqueue
from tests.conftest import Connections

#: on one xdist worker, one after another: the held-snapshot tests count the buffers a claim or a
#: producer reads, which other transactions in flight (test_claim_order's claimers) add to
pytestmark = pytest.mark.xdist_group("held_snapshot")


def _index_reads(conn: psycopg.Connection[Any]) -> int:
    """Entries of channel_eligible_idx that this transaction's scans stepped on, dead ones included."""
    row = conn.execute("SELECT pg_stat_get_xact_tuples_returned('fairqueue.channel_eligible_idx'::regclass)").fetchone()
    assert row is not None
    return int(row[0])


def _claim_one(conn: psycopg.Connection[Any], worker: int) -> fairqueue.ClaimedJob | None:
    jobs = fairqueue.claim_batch(conn, worker, 1)
    for job in jobs:
        fairqueue.complete(conn, worker, job.id)
    return jobs[0] if jobs else None


def _settle_floors(conn: psycopg.Connection[Any]) -> None:
    """Raises both floors as far as they go, as claims do (_advance_*), before a count of the entries
    a claim steps on. A write transaction open anywhere on the server at the last claims (another
    test's, an autoanalyze) holds them a step or two behind for a moment, and a claim then steps on a
    few more entries: CI saw 9, then 12 (the fewest of three) on PostgreSQL 15. What the counts guard
    against, scans from below the floor, costs hundreds more; this waits only for the floors to
    reach the lowest eligible channel and the lowest wakeup (a few seconds at most)."""
    for _ in range(300):
        # a transaction id used up: the floors excuse another database's transaction once 64 have
        # gone by since they began to wait for it (fq0018), and a quiet server would not use them
        conn.execute("SELECT pg_current_xact_id()")
        conn.execute("SELECT fairqueue._advance_vtime_floor(), fairqueue._advance_wakeup_floor()")
        row = conn.execute(
            "SELECT fairqueue._vtime_floor() >= coalesce(floor((SELECT min(vtime) FROM fairqueue.channel"
            " WHERE eligible) * 1048576) / 1048576, 0),"
            " fairqueue._wakeup_floor() >= coalesce((SELECT min(id) FROM fairqueue.channel_wakeup),"
            " (SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END"
            " FROM fairqueue.channel_wakeup_id_seq))"
        ).fetchone()
        if row == (True, True):
            return
        time.sleep(0.01)
    raise AssertionError("the floors did not reach the lowest eligible channel and wakeup in 300 tries")


def _floor(conn: psycopg.Connection[Any]) -> float:
    row = conn.execute("SELECT fairqueue._vtime_floor()").fetchone()
    assert row is not None
    return float(row[0])


def test_a_claim_under_a_held_snapshot_does_not_walk_the_old_versions_of_the_fair_order(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    claims = 1500
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": c} for c in ("bob", "carol") for _ in range(claims)])

    def claim_reads() -> int:
        """The fewest of three: a transaction of the server that happens to be open at one claim's
        turn (an autoanalyze here) holds the floor one step back for that claim; what this test
        guards against, scans from below the floor, costs every claim the same."""
        return min(one_claim_reads() for _ in range(3))

    def one_claim_reads() -> int:
        _settle_floors(conn)
        claimer = connect(autocommit=False)
        # The scans as they run at scale, through the index: with two channels the planner may pick a
        # sequential scan of the channel table in one session and the index in the next (the table's
        # statistics change as autovacuum and autoanalyze come by), and then the two counts would
        # measure different plans.
        claimer.execute("SET enable_seqscan = off")
        before = _index_reads(claimer)
        assert len(fairqueue.claim_batch(claimer, worker, 2)) == 2
        read = _index_reads(claimer) - before
        claimer.rollback()
        claimer.close()
        return read

    held = connect(autocommit=False, isolation="repeatable read")
    held.execute("SELECT count(*) FROM fairqueue.worker").fetchone()  # the snapshot is taken and kept
    for _ in range(500):  # each claim writes a new version of bob's or carol's row, and an index entry
        _claim_one(conn, worker)
    reads = claim_reads()
    for _ in range(claims - 510):
        _claim_one(conn, worker)
    # 1,000 more entries that no vacuum may remove lie below the channels' current ones: none is read
    assert claim_reads() <= reads + 2
    held.rollback()


def test_a_channel_woken_while_nothing_else_is_eligible_joins_at_the_floor(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.enqueue(conn, "k", channel="alice")
    assert _claim_one(conn, worker) is not None  # alice served once, then idle at a low virtual time
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 50)
    while _claim_one(conn, worker) is not None:  # bob alone: the floor follows him up
        pass
    row = conn.execute("SELECT fairqueue._vtime_floor() > vtime FROM fairqueue.channel WHERE name = 'alice'")
    assert row.fetchone() == (True,)
    alice = fairqueue.enqueue(conn, "k", channel="alice")  # nothing is eligible: she keeps her own vtime...
    claimed = _claim_one(conn, worker)  # ... raised to the floor's proposal, so the claim finds her
    assert claimed is not None and claimed.id == alice
    row = conn.execute("SELECT vtime >= fairqueue._vtime_floor() FROM fairqueue.channel WHERE name = 'alice'")
    assert row.fetchone() == (True,)


def test_the_floor_waits_for_an_open_transaction_that_makes_a_channel_eligible(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_channel(conn, "alice", paused=True)
    alice = fairqueue.enqueue(conn, "k", channel="alice")
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 60)
    for _ in range(5):
        assert _claim_one(conn, worker) is not None  # bob's
    operator = connect(autocommit=False)
    fairqueue.configure_channel(operator, "alice", paused=False)  # alice joins at bob's vtime, uncommitted
    for _ in range(40):  # bob runs on; the floor may not pass alice while her transaction is open
        claimed = _claim_one(conn, worker)
        assert claimed is not None and claimed.channel == "bob"
    operator.commit()
    row = conn.execute("SELECT vtime >= fairqueue._vtime_floor() FROM fairqueue.channel WHERE name = 'alice'")
    assert row.fetchone() == (True,)
    claimed = _claim_one(conn, worker)  # alice is 40 turns behind bob: hers is the next job
    assert claimed is not None and claimed.id == alice


# The wakeups' floor (schema/16_wakeup_floor.sql): claims look for wakeup rows from it.


def _wakeup_reads(conn: psycopg.Connection[Any]) -> int:
    """Entries of the wakeups' id index that this transaction's scans stepped on, dead ones included
    (a held snapshot keeps them from being marked dead). Counting entries, not buffers: where the
    heap puts a row varies between PostgreSQL versions, the number of entries a scan walks does not."""
    row = conn.execute("SELECT pg_stat_get_xact_tuples_returned('fairqueue.channel_wakeup_pkey'::regclass)").fetchone()
    assert row is not None
    return int(row[0])


def test_a_claim_under_a_held_snapshot_does_not_walk_the_consumed_wakeups(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    def wake_and_claim() -> None:  # alice is idle: her job comes with a wakeup, which the claim consumes
        fairqueue.enqueue(conn, "k", channel="alice")
        assert _claim_one(conn, worker) is not None

    def claim_reads() -> int:
        """The fewest of five: a write transaction open elsewhere at the last claims can hold the
        wakeup floor a step behind for a moment."""
        return min(one_claim_reads() for _ in range(5))

    def one_claim_reads() -> int:
        fairqueue.enqueue(conn, "k", channel="alice")
        _settle_floors(conn)
        claimer = connect(autocommit=False)
        # The scans as they run at scale, through the id index. With a few pages of wakeups the planner
        # may read the table instead, once autoanalyze has counted them: CI saw 0 entries read, then 3
        # (the same code, PostgreSQL 15), and an ANALYZE before each count gives 0 then 4 every time
        # here; those counts compared two plans, not two floors.
        claimer.execute("SET enable_seqscan = off")
        before = _wakeup_reads(claimer)
        assert len(fairqueue.claim_batch(claimer, worker, 1)) == 1
        read = _wakeup_reads(claimer) - before
        claimer.rollback()
        claimer.close()
        assert _claim_one(conn, worker) is not None
        return read

    held = connect(autocommit=False, isolation="repeatable read")
    held.execute("SELECT count(*) FROM fairqueue.worker").fetchone()  # the snapshot is taken and kept
    for _ in range(600):  # (the id index has its third level by then)
        wake_and_claim()
    reads = claim_reads()
    for _ in range(700):  # 700 more consumed wakeups that no vacuum may remove
        wake_and_claim()
    assert claim_reads() <= reads + 2
    held.rollback()


def test_the_wakeup_floor_waits_for_an_open_producer(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    producer = connect(autocommit=False)
    alice = fairqueue.enqueue(producer, "k", channel="alice")  # a wakeup with a low id, not committed
    for _ in range(50):  # bob's wakeups come after it, and are consumed
        fairqueue.enqueue(conn, "k", channel="bob")
        claimed = _claim_one(conn, worker)
        assert claimed is not None and claimed.channel == "bob"
    producer.commit()
    claimed = _claim_one(conn, worker)  # the floor waited for alice's producer: her wakeup is found
    assert claimed is not None and claimed.id == alice


def test_concurrent_producers_and_claimers_leave_nothing_below_either_floor(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """Both floors under real concurrency: claimers raise them while producers wake channels and
    other claims activate, charge and idle them. Every job is claimed (nothing is stranded below a
    floor), and at the end no eligible channel and no wakeup lies below its floor."""
    channels, per_producer, producers, claimers = 40, 300, 2, 3
    start = threading.Barrier(producers + claimers)
    produced = threading.Event()
    claimed: list[int] = []
    lock = threading.Lock()
    workers = [fairqueue.register_worker(conn, f"w{i}", lease_seconds=600) for i in range(claimers)]

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        db = connect()
        start.wait()
        for _ in range(per_producer):  # one job per transaction, into a channel that has often just idled
            fairqueue.enqueue(db, "k", channel=f"c{rng.randrange(channels)}")

    def claim(worker_id: int) -> None:
        db = connect()
        start.wait()
        empty_after_production = 0
        while empty_after_production < 50:
            jobs = fairqueue.claim_batch(db, worker_id, 5)
            if jobs:
                fairqueue.finish(db, worker_id, [fairqueue.Outcome(j.id) for j in jobs])
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
    row = conn.execute(
        "SELECT (SELECT count(*) FROM fairqueue.channel WHERE eligible AND vtime < fairqueue._vtime_floor()),"
        " (SELECT count(*) FROM fairqueue.channel_wakeup WHERE id < fairqueue._wakeup_floor()),"
        " (SELECT count(*) FROM fairqueue.job)"
    ).fetchone()
    assert row == (0, 0, 0)


def test_the_floor_waits_for_an_open_transaction_newer_than_every_completed_one(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """The open transaction that makes alice eligible is the newest one to have a transaction id when
    the next floor is proposed: every transaction that completed since is older (a claim that began
    before it). A snapshot's xmax does not cover it; the floor must wait for it all the same."""
    fairqueue.configure_channel(conn, "alice", paused=True)
    alice = fairqueue.enqueue(conn, "k", channel="alice")
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 60)
    assert _claim_one(conn, worker) is not None  # bob is active
    older = connect(autocommit=False)
    held_back = fairqueue.claim_batch(older, worker, 20)  # charges bob 20, not committed yet
    assert len(held_back) == 20
    operator = connect(autocommit=False)
    fairqueue.configure_channel(operator, "alice", paused=False)  # alice joins at bob's committed vtime
    older.commit()  # an older transaction completes: bob's vtime is 20 ahead of alice's
    for _ in range(10):  # bob runs on; the floor may not pass alice while her transaction is open
        claimed = _claim_one(conn, worker)
        assert claimed is not None and claimed.channel == "bob"
    operator.commit()
    claimed = _claim_one(conn, worker)
    assert claimed is not None and claimed.id == alice


def _wakeup_floor(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT fairqueue._wakeup_floor()").fetchone()
    assert row is not None
    return int(row[0])


def test_a_write_transaction_in_another_database_holds_neither_floor(
    conn: psycopg.Connection[Any], worker: int, server_url: str, db_url: str
) -> None:
    """Transaction ids are shared by the databases of a server, but a transaction in another database
    can neither read a proposal nor write a channel or a wakeup here: the floors do not wait for it
    (fq0018). They used to, and a long write elsewhere on the server kept them where they were."""
    if psycopg.conninfo.conninfo_to_dict(server_url).get("dbname") == psycopg.conninfo.conninfo_to_dict(db_url).get(
        "dbname"
    ):
        pytest.skip("needs a database other than the test database on the server")
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": c} for c in ("bob", "carol") for _ in range(80)])
    elsewhere = psycopg.connect(server_url, autocommit=False)
    try:
        elsewhere.execute("SELECT pg_current_xact_id()")  # a transaction id, kept while the claims run
        for _ in range(3):  # the floors take the proposals made before it, then would stop at it
            assert _claim_one(conn, worker) is not None
            fairqueue.enqueue(conn, "k", channel="alice")  # a wakeup: alice is idle again after each
            assert _claim_one(conn, worker) is not None
        vtime_floor, wakeup_floor = _floor(conn), _wakeup_floor(conn)
        for _ in range(30):  # (the floors look for the other database once 64 transaction ids have passed)
            assert _claim_one(conn, worker) is not None
            fairqueue.enqueue(conn, "k", channel="alice")
            assert _claim_one(conn, worker) is not None
        assert _floor(conn) > vtime_floor
        assert _wakeup_floor(conn) > wakeup_floor
    finally:
        elsewhere.close()


def test_a_write_transaction_in_this_database_holds_both_floors(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """The other side of the test above: an open transaction here that has a transaction id (it may
    have read a proposal) keeps both floors where they are until it ends."""
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": c} for c in ("bob", "carol") for _ in range(80)])
    here = connect(autocommit=False)
    here.execute("SELECT pg_current_xact_id()")
    for _ in range(3):
        assert _claim_one(conn, worker) is not None
        fairqueue.enqueue(conn, "k", channel="alice")
        assert _claim_one(conn, worker) is not None
    vtime_floor, wakeup_floor = _floor(conn), _wakeup_floor(conn)
    for _ in range(30):
        assert _claim_one(conn, worker) is not None
        fairqueue.enqueue(conn, "k", channel="alice")
        assert _claim_one(conn, worker) is not None
    assert (_floor(conn), _wakeup_floor(conn)) == (vtime_floor, wakeup_floor)
    here.rollback()
    assert _claim_one(conn, worker) is not None
    assert _claim_one(conn, worker) is not None
    assert _floor(conn) > vtime_floor
