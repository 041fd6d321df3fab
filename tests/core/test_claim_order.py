"""Concurrent claims keep the fair order (revision fq0014).

A claim puts the eligible channels in order as its statement's snapshot sees them, then locks the
first ones with SKIP LOCKED. When another claim charges the first channel and commits in between, the
lock lands on the channel's new row, whose virtual time is now later than the next channel's: the
claim must skip it (as if still held) rather than serve it a second time in the same turn. Without
that, two claims starting together both serve the first channel, and the next channel loses its turn.

The race needs a commit to land between one claim's snapshot and its lock, so the test starts several
claims together (a barrier) over many rounds and checks every round exactly: without the skip,
dozens of its rounds go wrong on an idle two-core machine (one channel twice, another not at all)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import Outcome
from tests.conftest import Connections
from tests.helpers import assert_consistent

#: on one xdist worker, one after another: the held-snapshot tests count the buffers a claim or a
#: producer reads, which other transactions in flight (test_claim_order's claimers) add to
pytestmark = pytest.mark.xdist_group("held_snapshot")

CLAIMERS = 4
ROUNDS = 100
BATCH = 10


def _flood(conn: psycopg.Connection[Any], channels: list[str], per_channel: int, *, keyed: bool) -> None:
    """``per_channel`` jobs in each channel (kind = channel; with ``keyed``, each job its own fair key),
    every channel and key in turn before the first round: the order is what is under test here."""
    for channel in channels:
        keys = [f"user-{i}" for i in range(per_channel)] if keyed else [None] * per_channel
        conn.execute(
            "SELECT fairqueue.enqueue_many(%s::text[], p_channels => %s::text[], p_fair_keys => %s::text[])",
            ([channel] * per_channel, [channel] * per_channel, keys),
        )
    while conn.execute(
        "SELECT fairqueue.promote_due_jobs(), EXISTS (SELECT 1 FROM fairqueue.channel_wakeup)"
    ).fetchone() != (False, False):
        pass


def _claim_in_rounds(
    connect: Connections, conn: psycopg.Connection[Any], claimers: int, rounds: int
) -> list[Counter[str]]:
    """``claimers`` workers claim a batch each, starting every round together (a barrier), and finish
    their jobs before the next round: the kinds each round took."""
    workers = [fairqueue.register_worker(conn, f"w{i}", lease_seconds=600) for i in range(claimers)]
    barrier = threading.Barrier(claimers)
    taken: list[Counter[str]] = [Counter() for _ in range(rounds)]
    lock = threading.Lock()

    def claim(worker_id: int) -> None:
        db = connect()
        for r in range(rounds):
            barrier.wait()
            jobs = fairqueue.claim_batch(db, worker_id, BATCH)
            with lock:
                taken[r].update(j.kind for j in jobs)
            barrier.wait()
            fairqueue.finish(db, worker_id, [Outcome(j.id) for j in jobs])

    threads = [threading.Thread(target=claim, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return taken


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "fair-keys"])
def test_claims_starting_together_serve_each_channel_once_per_round(
    connect: Connections, conn: psycopg.Connection[Any], keyed: bool
) -> None:
    """As many channels as claimers, each flooded: every claim of every round takes one channel's
    next batch, and each channel is served exactly once per round (the one who claims it is free)."""
    channels = [f"tenant-{i}" for i in range(CLAIMERS)]
    _flood(conn, channels, ROUNDS * BATCH, keyed=keyed)
    rounds = _claim_in_rounds(connect, conn, CLAIMERS, ROUNDS)
    wrong = [(r, dict(c)) for r, c in enumerate(rounds) if c != dict.fromkeys(channels, BATCH)]
    assert wrong == []
    assert conn.execute("SELECT count(*) FROM fairqueue.job").fetchone() == (0,)
    assert_consistent(conn)


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "fair-keys"])
def test_two_claims_share_three_busy_channels_equally(
    connect: Connections, conn: psycopg.Connection[Any], keyed: bool
) -> None:
    """Fewer busy channels than slots across the fleet, and not a multiple of the claims: 3 flooded
    channels, 2 claimers starting each round together. Each claim takes its share of the channels
    rounded down (one, with a whole batch), and the channel left out is the furthest behind, so it
    goes first in the next round: every channel gets the same service. (Rounded up, one claim took
    two channels and the other the third, always the one furthest ahead, with a whole batch: 300
    against 150 and 150.)"""
    channels, rounds, claimers = ["tenant-a", "tenant-b", "tenant-c"], 30, 2
    _flood(conn, channels, rounds * BATCH * claimers, keyed=keyed)
    taken = sum(_claim_in_rounds(connect, conn, claimers, rounds), Counter[str]())
    assert taken == dict.fromkeys(channels, rounds * BATCH * claimers // len(channels))
    assert_consistent(conn)
