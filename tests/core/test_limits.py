"""Invariant 5 (limits are exact across the fleet) and invariant 6's "never claimed twice".

Concurrency tests use real connections in threads, started together at a barrier, and check counts
at barrier checkpoints, where the sum of what every worker holds is the true number running.
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
from tests.helpers import assert_consistent, race_against_open_transaction


def test_max_concurrency_is_exact_across_eight_claimers(connect: Connections, conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_channel(conn, "capped", max_concurrency=3)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "capped"}] * 200)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "open"}] * 2000)
    threads_n, rounds = 8, 12
    barrier = threading.Barrier(threads_n)
    held: list[list[fairqueue.ClaimedJob]] = [[] for _ in range(threads_n)]
    checkpoints: list[list[int]] = [[] for _ in range(rounds)]
    seen: list[list[int]] = [[] for _ in range(threads_n)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            c = connect()
            me = fairqueue.register_worker(c, f"w{i}", lease_seconds=300)
            rng = random.Random(i)
            for r in range(rounds):
                barrier.wait()
                batch = fairqueue.claim_batch(c, me, rng.randint(1, 8))
                held[i].extend(batch)
                seen[i].extend(j.id for j in batch)
                barrier.wait()  # checkpoint: everyone has claimed; nobody finishes until all have counted
                checkpoints[r].append(sum(j.channel == "capped" for j in held[i]))
                barrier.wait()
                done = [j for j in held[i] if rng.random() < 0.5]
                fairqueue.finish(c, me, [fairqueue.Outcome(j.id) for j in done])
                held[i] = [j for j in held[i] if j not in done]
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    totals = [sum(c) for c in checkpoints]
    assert max(totals) <= 3, totals
    assert totals.count(3) >= rounds // 2, f"the cap should be used, not just respected: {totals}"
    all_ids = [x for s in seen for x in s]
    assert len(all_ids) == len(set(all_ids)), "a job was claimed twice"
    assert_consistent(conn)


def test_parallel_claimers_never_claim_a_job_twice_and_lose_none(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    ids = set(fairqueue.enqueue_many(conn, [{"kind": "k", "channel": f"c{i % 5}"} for i in range(3000)]))
    fairqueue.configure_channel(conn, "c0", max_concurrency=2)
    barrier = threading.Barrier(8)
    claimed: list[list[int]] = [[] for _ in range(8)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            c = connect()
            me = fairqueue.register_worker(c, f"w{i}", lease_seconds=300)
            barrier.wait()
            empty = 0
            while empty < 3:
                batch = fairqueue.claim_batch(c, me, 10)
                empty = 0 if batch else empty + 1
                claimed[i].extend(j.id for j in batch)
                fairqueue.finish(c, me, [fairqueue.Outcome(j.id) for j in batch])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    flat = [x for ids_ in claimed for x in ids_]
    assert len(flat) == len(set(flat)), "a job was claimed twice"
    assert set(flat) == ids, f"{len(ids - set(flat))} jobs were never claimed"
    assert conn.execute("SELECT count(*) FROM fairqueue.completed_job WHERE outcome = 'succeeded'").fetchone() == (
        3000,
    )
    assert_consistent(conn)


def test_claim_does_not_wait_for_a_claimer_holding_its_transaction(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    for name in ("a", "b"):
        fairqueue.enqueue_many(conn, [{"kind": "k", "channel": name}] * 10)
    w1 = fairqueue.register_worker(conn)
    w2 = fairqueue.register_worker(conn)
    fairqueue.claim_batch(conn, w1, 2)  # both channels now known to be busy
    slow = connect(autocommit=False)
    first = fairqueue.claim_batch(slow, w1, 1)  # holds its channel's row until it commits
    fast = connect()
    fast.execute("SET statement_timeout = '2s'")
    second = fairqueue.claim_batch(fast, w2, 1)
    assert {first[0].channel, second[0].channel} == {"a", "b"}
    slow.commit()


def test_a_claim_shares_a_held_channel_without_limits_instead_of_waiting(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """Work-conserving without queueing: with one busy channel held by another claimer for the length
    of its claim, the second claimer takes the channel's next jobs at once (never the same ones), and
    the virtual time it did not charge is owed, then paid by the next holder of the channel's row."""
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 20)
    w1, w2 = fairqueue.register_worker(conn), fairqueue.register_worker(conn)
    fairqueue.claim_batch(conn, w1, 1)  # bob is active (vtime 1)
    first = connect(autocommit=False)
    held = fairqueue.claim_batch(first, w1, 5)  # holds bob's row until it commits
    got: list[fairqueue.ClaimedJob] = []
    waited = race_against_open_transaction(conn, first, lambda: got.extend(fairqueue.claim_batch(connect(), w2, 5)))
    assert not waited, "the second claim should not wait for bob's row"
    assert len(got) == 5 and not {j.id for j in got} & {j.id for j in held}
    assert conn.execute("SELECT channel, vtime FROM fairqueue.channel_debt").fetchall() == [("bob", 5.0)]
    assert conn.execute("SELECT vtime FROM fairqueue.channel WHERE name = 'bob'").fetchone() == (6.0,)

    assert len(fairqueue.claim_batch(conn, w1, 2)) == 2  # pays the debt (the row is free), then charges
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_debt").fetchone() == (0,)
    assert conn.execute("SELECT vtime FROM fairqueue.channel WHERE name = 'bob'").fetchone() == (13.0,)
    assert_consistent(conn)


def test_claim_waits_briefly_for_a_held_capped_channel_rather_than_come_back_empty(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """A capped (or rate-limited) channel needs its row for the exact count, so it is not shared:
    with it held by another claimer, the second claimer waits for it instead of returning nothing."""
    fairqueue.configure_channel(conn, "bob", max_concurrency=100)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 20)
    w1, w2 = fairqueue.register_worker(conn), fairqueue.register_worker(conn)
    fairqueue.claim_batch(conn, w1, 1)  # bob is active
    first = connect(autocommit=False)
    fairqueue.claim_batch(first, w1, 5)  # holds bob's row until it commits
    got: list[fairqueue.ClaimedJob] = []
    waited = race_against_open_transaction(conn, first, lambda: got.extend(fairqueue.claim_batch(connect(), w2, 5)))
    assert waited, "the second claim should wait for bob"
    assert len(got) == 5
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_debt").fetchone() == (0,)
    assert conn.execute("SELECT running FROM fairqueue.channel WHERE name = 'bob'").fetchone() == (11,)


def test_rate_limit_holds_across_claimers(connect: Connections, conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_channel(conn, "limited", rate_limit="20/s")
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "limited"}] * 500)
    barrier = threading.Barrier(4)
    counts = [0] * 4
    window = 1.0
    started: list[float] = []

    def run(i: int) -> None:
        c = connect()
        me = fairqueue.register_worker(c, f"w{i}", lease_seconds=300)
        barrier.wait()
        if i == 0:
            started.append(time.monotonic())
        deadline = time.monotonic() + window
        while time.monotonic() < deadline:
            batch = fairqueue.claim_batch(c, me, 10)
            counts[i] += len(batch)
            fairqueue.finish(c, me, [fairqueue.Outcome(j.id) for j in batch])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started[0]
    total = sum(counts)
    # a token bucket of 20/s with burst 1 starts at most 1 + 20 * elapsed jobs, whoever claims them
    assert total <= 1 + 20 * elapsed + 1, (total, elapsed)
    assert total >= 10 * window, f"rate limit should still let jobs through: {total}"


def test_rate_limited_channel_does_not_hold_up_others(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_channel(conn, "slow", rate_limit="1/h")
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "slow"}] * 10)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "fast"}] * 10)
    first = fairqueue.claim_batch(conn, worker, 20)
    assert sorted(j.channel for j in first) == ["fast"] * 10 + ["slow"]
    assert fairqueue.claim_batch(conn, worker, 20) == []
    throttled = conn.execute(
        "SELECT throttled_until > now() + interval '59 minutes' FROM fairqueue.channel WHERE name = 'slow'"
    ).fetchone()
    assert throttled == (True,)


def test_a_drained_channel_whose_throttle_expires_does_not_break_the_claim(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    """Regression: lifting an expired throttle of an idle channel, with no wakeups pending, made the
    claim fail (active computed as NULL)."""
    fairqueue.configure_channel(conn, "limited", rate_limit="1/h")
    fairqueue.enqueue(conn, "k", channel="limited")
    assert len(fairqueue.claim_batch(conn, worker, 10)) == 1
    assert fairqueue.claim_batch(conn, worker, 10) == []  # drained and throttled: it goes idle
    conn.execute("UPDATE fairqueue.channel SET throttled_until = now() - interval '1 second' WHERE name = 'limited'")
    assert fairqueue.claim_batch(conn, worker, 10) == []
    assert conn.execute("SELECT active, throttled_until FROM fairqueue.channel WHERE name = 'limited'").fetchone() == (
        False,
        None,
    )


def test_burst_allows_back_to_back_starts(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_channel(conn, "bursty", rate_limit="1/h", burst=5)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bursty"}] * 10)
    assert len(fairqueue.claim_batch(conn, worker, 10)) == 5


def test_a_channel_that_idled_starts_no_more_than_its_burst(conn: psycopg.Connection[Any], worker: int) -> None:
    """The token bucket refills while a channel idles, but never past its burst: at 100/s, half a
    second idle would make 50 tokens; the channel that comes back starts 3 back to back, not 50."""
    fairqueue.configure_channel(conn, "api", rate_limit="100/s", burst=3)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "api"}] * 3)
    first = fairqueue.claim_batch(conn, worker, 10)
    assert len(first) == 3  # the bucket is empty
    fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in first])
    assert fairqueue.claim_batch(conn, worker, 10) == []  # drained: the channel goes idle
    time.sleep(0.5)  # idle: the bucket fills up (only more tokens could come of a longer wait)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "api"}] * 40)
    assert len(fairqueue.claim_batch(conn, worker, 40)) == 3
    tokens = conn.execute("SELECT tokens FROM fairqueue.channel WHERE name = 'api'").fetchone()
    assert tokens is not None and tokens[0] < 1
    assert_consistent(conn)


def test_finishing_frees_a_slot_for_the_next_claim(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_channel(conn, "capped", max_concurrency=2)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "capped"}] * 5)
    batch = fairqueue.claim_batch(conn, worker, 10)
    assert len(batch) == 2 and fairqueue.claim_batch(conn, worker, 10) == []
    fairqueue.finish(conn, worker, [fairqueue.Outcome(batch[0].id)])
    assert len(fairqueue.claim_batch(conn, worker, 10)) == 1
    assert_consistent(conn)


BAD_CONFIGS: list[tuple[dict[str, Any], str]] = [
    ({"max_concurrency": 0}, "max_concurrency must be a whole number of at least 1"),
    ({"max_concurrency": 2.5}, "max_concurrency must be"),
    ({"weight": 0}, "weight must be a whole number from 1 to 1000"),
    ({"weight": True}, "weight must be"),
    ({"rate_limit": "ten per second"}, "is not understood"),
    ({"rate_limit": "0/s"}, "more than zero"),
    ({"rate_limit": 10}, "must be a string"),
    ({"burst": 5}, "burst only applies together with a rate_limit"),
    ({"rate_limit": "5/s", "burst": 0.5}, "burst must be a number of at least 1"),
    ({"paused": "yes"}, "paused must be True or False"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_CONFIGS)
def test_bad_channel_settings_are_rejected(conn: psycopg.Connection[Any], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(fairqueue.InvalidChannelConfigError, match=message):
        fairqueue.configure_channel(conn, "bob", **kwargs)
    assert conn.execute("SELECT count(*) FROM fairqueue.channel").fetchone() == (0,)


@pytest.mark.parametrize(
    ("text", "per_second"),
    [("10/s", 10.0), ("600/m", 10.0), ("5/h", 5 / 3600), ("100/d", 100 / 86400), ("3/10s", 0.3), ("1.5/sec", 1.5)],
)
def test_rate_limit_forms(text: str, per_second: float) -> None:
    from fairqueue.validation import parse_rate_limit

    assert parse_rate_limit(text)[1] == pytest.approx(per_second)


def test_configure_channel_replaces_all_settings(conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_channel(conn, "bob", max_concurrency=2, rate_limit="5/s", weight=3, paused=True)
    fairqueue.configure_channel(conn, "bob", weight=2)
    [info] = fairqueue.list_channels(conn)
    assert (info.max_concurrency, info.rate_limit, info.weight, info.paused) == (None, None, 2, False)


def test_capping_a_busy_channel_counts_its_running_jobs(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 10)
    running = fairqueue.claim_batch(conn, worker, 3)
    fairqueue.configure_channel(conn, "bob", max_concurrency=2)
    assert fairqueue.claim_batch(conn, worker, 10) == []  # 3 running, cap 2
    fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in running[:2]])
    assert len(fairqueue.claim_batch(conn, worker, 10)) == 1
    assert_consistent(conn)


def test_cap_set_while_a_finish_is_in_flight(connect: Connections, conn: psycopg.Connection[Any], worker: int) -> None:
    """The finish has deleted its running row but not committed when the channel gains a cap."""
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 4)
    jobs = fairqueue.claim_batch(conn, worker, 2)
    finishing = connect(autocommit=False)
    fairqueue.complete(finishing, worker, jobs[0].id)
    race_against_open_transaction(
        conn, finishing, lambda: fairqueue.configure_channel(connect(), "bob", max_concurrency=1)
    )
    assert conn.execute("SELECT running FROM fairqueue.channel WHERE name = 'bob'").fetchone() == (1,)
    assert_consistent(conn)


def test_finish_while_a_cap_is_being_set(connect: Connections, conn: psycopg.Connection[Any], worker: int) -> None:
    """The cap's recount has counted (and locked) the running job when its finish arrives."""
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 4)
    jobs = fairqueue.claim_batch(conn, worker, 2)
    admin = connect(autocommit=False)
    fairqueue.configure_channel(admin, "bob", max_concurrency=1)  # counted 2 running, not committed
    race_against_open_transaction(conn, admin, lambda: fairqueue.complete(connect(), worker, jobs[0].id))
    assert conn.execute("SELECT running FROM fairqueue.channel WHERE name = 'bob'").fetchone() == (1,)
    assert_consistent(conn)


def _bob_running(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM fairqueue.running_job WHERE channel = 'bob' AND worker_id IS NOT NULL"
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("settings", "most_started"),
    [({"max_concurrency": 2}, 2), ({"rate_limit": "1/m"}, 1), ({"paused": True}, 0)],
    ids=["cap", "rate", "pause"],
)
def test_a_limit_being_set_holds_for_a_claim_that_would_share_the_channel(
    connect: Connections, conn: psycopg.Connection[Any], settings: dict[str, Any], most_started: int
) -> None:
    """A shared take reads the channel's limits without its row; while configure_channel holds the
    row to add a limit, the claim must not take jobs the new limit would not count."""
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 20)
    w1, w2 = fairqueue.register_worker(conn), fairqueue.register_worker(conn)
    first = fairqueue.claim_batch(conn, w1, 1)  # bob is active
    fairqueue.finish(conn, w1, [fairqueue.Outcome(j.id) for j in first])
    admin = connect(autocommit=False)
    fairqueue.configure_channel(admin, "bob", **settings)  # holds bob's row until it commits
    got: list[fairqueue.ClaimedJob] = []
    race_against_open_transaction(conn, admin, lambda: got.extend(fairqueue.claim_batch(connect(), w2, 5)))
    more = fairqueue.claim_batch(conn, w1, 5)
    assert len(got) + len(more) <= most_started, (len(got), len(more))
    if "max_concurrency" in settings:
        assert conn.execute("SELECT running FROM fairqueue.channel WHERE name = 'bob'").fetchone() == (
            _bob_running(conn),
        )
    assert_consistent(conn)


def test_a_held_rate_limited_channel_is_not_shared(connect: Connections, conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_channel(conn, "bob", rate_limit="2/s", burst=100)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 20)
    w1, w2 = fairqueue.register_worker(conn), fairqueue.register_worker(conn)
    fairqueue.claim_batch(conn, w1, 1)  # bob is active
    conn.execute("UPDATE fairqueue.channel SET tokens = 6, tokens_at = now() WHERE name = 'bob'")
    first = connect(autocommit=False)
    held = fairqueue.claim_batch(first, w1, 5)  # holds bob's row; one token left
    got: list[fairqueue.ClaimedJob] = []
    race_against_open_transaction(conn, first, lambda: got.extend(fairqueue.claim_batch(connect(), w2, 5)))
    assert len(held) == 5 and len(got) <= 1  # six tokens, six starts at most
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_debt").fetchone() == (0,)


def test_the_debt_of_a_held_channel_stays_owed_and_is_not_waited_for(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "bob"}] * 30)
    fairqueue.enqueue_many(conn, [{"kind": "k", "channel": "alice"}] * 30)
    w1, w2 = fairqueue.register_worker(conn), fairqueue.register_worker(conn)
    fairqueue.claim_batch(conn, w1, 2)  # both active
    conn.execute("INSERT INTO fairqueue.channel_debt (channel, vtime) VALUES ('bob', 5)")
    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM fairqueue.channel WHERE name = 'bob' FOR NO KEY UPDATE")  # as a claim would
    got: list[fairqueue.ClaimedJob] = []
    waited = race_against_open_transaction(conn, holder, lambda: got.extend(fairqueue.claim_batch(connect(), w2, 1)))
    assert not waited, "paying debts must skip a held channel, not wait for it"
    assert [j.channel for j in got] == ["alice"]
    assert conn.execute("SELECT sum(vtime) FROM fairqueue.channel_debt WHERE channel = 'bob'").fetchone() == (5.0,)


def test_claim_does_not_wait_for_a_channel_held_by_configure(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_channel(conn, "bob", weight=1)  # bob exists and is idle
    admin = connect(autocommit=False)
    fairqueue.configure_channel(admin, "bob", weight=2)  # holds bob's row until it commits
    job = fairqueue.enqueue(conn, "k", channel="bob")
    other = fairqueue.enqueue(conn, "k", channel="alice")
    claimer = connect()
    claimer.execute("SET statement_timeout = '2s'")
    assert [j.id for j in fairqueue.claim_batch(claimer, worker, 10)] == [other]
    admin.commit()
    assert [j.id for j in fairqueue.claim_batch(claimer, worker, 10)] == [job]
    assert_consistent(conn)
