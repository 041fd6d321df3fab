"""Invariant 13 for claims: the fair order's scans begin at a floor (schema/15_vtime_floor.sql).

Every claim writes a new version of the channel rows it serves, and each adds an entry to
channel_eligible_idx; while a snapshot is held none can be removed, and a scan from the lowest
virtual time would walk them all. The scans begin at a floor instead, which needs two guarantees,
each tested here with the mechanism that gives it: no channel becomes eligible below the floor (the
trigger that clamps its virtual time), and the floor does not rise past a channel that a transaction
still open is making eligible (the floor waits for the transactions older than its proposal).

Reads are counted with PostgreSQL's per-transaction counters, not timed.
"""

from __future__ import annotations

from typing import Any

import psycopg

import fairqueue
from tests.conftest import Connections


def _index_reads(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_stat_get_xact_blocks_fetched('fairqueue.channel_eligible_idx'::regclass)").fetchone()
    assert row is not None
    return int(row[0])


def _claim_one(conn: psycopg.Connection[Any], worker: int) -> fairqueue.ClaimedJob | None:
    jobs = fairqueue.claim_batch(conn, worker, 1)
    for job in jobs:
        fairqueue.complete(conn, worker, job.id)
    return jobs[0] if jobs else None


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
        claimer = connect(autocommit=False)
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
    assert claim_reads() <= reads + 1
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
