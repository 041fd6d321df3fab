"""Invariant 4: round-robin across channels with eligible work, weighted, work-conserving."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue.maintenance import promote_due_jobs
from tests.conftest import Connections
from tests.helpers import assert_consistent, channel_counts, drain, race_against_open_transaction


def jain_index(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


@pytest.mark.parametrize("newcomer", ["alice", "zed"])  # before and after "bob" in name order
def test_bob_ten_thousand_then_alice_one(conn: psycopg.Connection[Any], worker: int, newcomer: str) -> None:
    fairqueue.enqueue_many(conn, [{"kind": "bob.job", "channel": "bob"}] * 10_000)
    alice = fairqueue.enqueue(conn, "alice.job", channel=newcomer)
    first = fairqueue.claim_batch(conn, worker, 10)
    assert alice in [j.id for j in first]
    assert channel_counts(first) == {"bob": 9, newcomer: 1}


@pytest.mark.parametrize("newcomer", ["alice", "zed"])
def test_alice_first_even_when_each_claim_takes_one_channel(
    conn: psycopg.Connection[Any], worker: int, newcomer: str
) -> None:
    """With as many workers as busy channels, a claim takes a single channel: Alice's must be it."""
    fairqueue.register_worker(conn, "another")
    fairqueue.enqueue_many(conn, [{"kind": "bob.job", "channel": "bob"}] * 10_000)
    fairqueue.claim_batch(conn, worker, 10)  # Bob is being served
    alice = fairqueue.enqueue(conn, "alice.job", channel=newcomer)
    assert alice in [j.id for j in fairqueue.claim_batch(conn, worker, 10)]


def test_alice_arriving_mid_backlog_is_served_in_the_next_claim(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue_many(conn, [{"kind": "bob.job", "channel": "bob"}] * 10_000)
    for _ in range(50):  # Bob has had 5,000 jobs of service by now
        fairqueue.claim_batch(conn, worker, 100)
    alice = fairqueue.enqueue(conn, "alice.job", channel="zed")
    assert alice in [j.id for j in fairqueue.claim_batch(conn, worker, 2)]


def test_batches_interleave_channels(conn: psycopg.Connection[Any], worker: int) -> None:
    for name in ("a", "b", "c"):
        fairqueue.enqueue_many(conn, [{"kind": "k", "channel": name}] * 100)
    batch = fairqueue.claim_batch(conn, worker, 30)
    assert [j.channel for j in batch] == ["a", "b", "c"] * 10


def test_more_busy_channels_than_slots_take_turns(conn: psycopg.Connection[Any], worker: int) -> None:
    """With 20 busy channels and 5 slots per claim, four claims serve every channel once."""
    names = [f"t{i:02}" for i in range(20)]
    for name in names:
        fairqueue.enqueue_many(conn, [{"kind": "k", "channel": name}] * 50)
    for _ in range(3):
        served: Counter[str] = Counter()
        for _ in range(4):
            served.update(j.channel for j in fairqueue.claim_batch(conn, worker, 5))
        assert served == dict.fromkeys(names, 1)


def test_within_a_channel_jobs_run_in_enqueue_order(conn: psycopg.Connection[Any], worker: int) -> None:
    ids = fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 50)
    assert [j.id for j in drain(conn, worker, batch=7)] == ids


def test_weights_share_service(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_channel(conn, "heavy", weight=3)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "heavy"}] * 1000)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "light"}] * 1000)
    served: Counter[str] = Counter()
    for _ in range(20):
        batch = fairqueue.claim_batch(conn, worker, 20)
        served.update(j.channel for j in batch)
        fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in batch])
    assert served == {"heavy": 300, "light": 100}


def test_equal_channels_get_equal_service(conn: psycopg.Connection[Any], worker: int) -> None:
    names = [f"tenant{i}" for i in range(10)]
    for name in names:
        fairqueue.enqueue_many(conn, [{"kind": "k", "channel": name}] * 300)
    served: Counter[str] = Counter()
    for _ in range(100):
        served.update(j.channel for j in fairqueue.claim_batch(conn, worker, 13))
    assert jain_index([float(served[n]) for n in names]) >= 0.999


def test_capped_channel_does_not_idle_the_worker(conn: psycopg.Connection[Any], worker: int) -> None:
    """Work-conserving: slots a capped channel cannot use go to other channels in the same claim."""
    fairqueue.configure_channel(conn, "capped", max_concurrency=1)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "capped"}] * 100)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "open"}] * 100)
    assert channel_counts(fairqueue.claim_batch(conn, worker, 10)) == {"capped": 1, "open": 9}


def test_exhausted_channel_gives_its_slots_to_others(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "small"}] * 2)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "big"}] * 100)
    assert channel_counts(fairqueue.claim_batch(conn, worker, 20)) == {"small": 2, "big": 18}


def test_channel_returning_from_idle_does_not_jump_the_queue(conn: psycopg.Connection[Any], worker: int) -> None:
    """A channel that was idle while others were served rejoins at par: no stored-up credit."""
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "a"}] * 500)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "b"}] * 500)
    for _ in range(20):
        fairqueue.claim_batch(conn, worker, 20)  # a and b have each had 200 jobs of service
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "c"}] * 500)
    assert channel_counts(fairqueue.claim_batch(conn, worker, 30)) == {"a": 10, "b": 10, "c": 10}


def test_channel_idle_for_a_while_does_not_cash_in_old_credit(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "a"}] * 500)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "b"}] * 500)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "c"}] * 5)
    for _ in range(20):
        fairqueue.claim_batch(conn, worker, 20)  # c ran dry early; a and b got ~200 each since
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "c"}] * 500)
    served = channel_counts(fairqueue.claim_batch(conn, worker, 30))
    assert all(9 <= served[name] <= 11 for name in "abc"), served  # a third each, ties aside


def test_ten_thousand_idle_channels_do_not_get_in_the_way(conn: psycopg.Connection[Any], worker: int) -> None:
    conn.execute("INSERT INTO fairqueue.channel (name) SELECT 'idle' || g FROM generate_series(1, 10000) g")
    job = fairqueue.enqueue(conn, "k", channel="busy")
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [job]
    plan = conn.execute(
        "EXPLAIN SELECT name FROM fairqueue.channel WHERE eligible ORDER BY vtime, name LIMIT 10"
    ).fetchall()
    assert "channel_eligible_idx" in " ".join(r[0] for r in plan)


def test_paused_channel_is_skipped_until_resumed(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_channel(conn, "bob", paused=True)
    job = fairqueue.enqueue(conn, "k", channel="bob")
    other = fairqueue.enqueue(conn, "k", channel="alice")
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [other]
    fairqueue.configure_channel(conn, "bob", paused=False)
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [job]
    assert_consistent(conn)


def test_weights_hold_when_concurrent_claims_share_the_channels(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """A claim that finds every busy channel held by a concurrent claim shares them in equal parts
    (weights are not applied within a shared take); the debt it leaves must be the weighted charge
    (jobs / weight), so that over the following claims heavy (weight 3) still gets three times
    light's service. A debt of one per job would leave heavy behind for good.

    Two claims of the same worker are in flight at once: the first holds both channel rows (its
    transaction stays open) while the second claims."""
    fairqueue.configure_channel(conn, "heavy", weight=3)
    fairqueue.configure_channel(conn, "light", weight=1)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": c} for c in ("heavy", "light") for _ in range(150)])
    worker = fairqueue.register_worker(conn, "w", lease_seconds=300)
    promote_due_jobs(conn)  # both channels active, at the same virtual time
    served: list[Counter[str]] = []
    for _ in range(5):
        first = connect(autocommit=False)
        held = fairqueue.claim_batch(first, worker, 8)  # holds both channels' rows until it commits
        shared: list[fairqueue.ClaimedJob] = []

        def share(into: list[fairqueue.ClaimedJob] = shared) -> None:
            into.extend(fairqueue.claim_batch(connect(), worker, 8))

        waited = race_against_open_transaction(conn, first, share)
        assert not waited
        assert channel_counts(shared) == {"heavy": 4, "light": 4}  # a shared take: equal parts
        served.append(channel_counts(held) + channel_counts(shared))
    after_first = sum(served[1:], Counter[str]())
    assert after_first == {"heavy": 48, "light": 16}, served
    assert_consistent(conn)
