"""Priority orders jobs within their channel only (invariant 11): a higher priority runs earlier in its
channel, then enqueue order; it never takes another channel's turn, and it holds through delays,
retries, operators' retries, bulk enqueues and claims of one job at a time. A FIFO key keeps enqueue
order whatever the priorities."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import Outcome


def _claim_kinds(conn: psycopg.Connection[Any], worker: int, n: int) -> list[str]:
    return [j.kind for j in fairqueue.claim_batch(conn, worker, n)]


def test_higher_priority_runs_first_within_a_channel_then_enqueue_order(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    for kind, priority in [("low", -5), ("normal-1", 0), ("urgent", 50), ("normal-2", 0), ("lower", -100)]:
        fairqueue.enqueue(conn, kind, channel="acme", priority=priority)
    assert _claim_kinds(conn, worker, 10) == ["urgent", "normal-1", "normal-2", "low", "lower"]


def test_one_at_a_time_the_next_claim_takes_the_next_priority(conn: psycopg.Connection[Any], worker: int) -> None:
    for kind, priority in [("c", 1), ("a", 3), ("b", 2), ("d", 1)]:
        fairqueue.enqueue(conn, kind, channel="acme", priority=priority)
    assert [_claim_kinds(conn, worker, 1) for _ in range(5)] == [["a"], ["b"], ["c"], ["d"], []]


def test_a_priority_never_takes_another_channels_turn(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue_many(conn, [{"kind": "bob", "channel": "bob", "priority": 100} for _ in range(20)])
    fairqueue.enqueue(conn, "alice", channel="alice", priority=-100)
    first = fairqueue.claim_batch(conn, worker, 2)
    assert sorted(j.channel for j in first) == ["alice", "bob"]  # round robin, whatever the priorities


def test_priorities_through_enqueue_many_and_bulk_enqueue(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue_many(
        conn, [fairqueue.JobSpec("m-low", channel="a"), fairqueue.JobSpec("m-high", channel="a", priority=9)]
    )
    fairqueue.bulk_enqueue(conn, [{"kind": "b-low", "channel": "b"}, {"kind": "b-high", "channel": "b", "priority": 9}])
    claimed = fairqueue.claim_batch(conn, worker, 10)
    by_channel = {c: [j.kind for j in claimed if j.channel == c] for c in ("a", "b")}
    assert by_channel == {"a": ["m-high", "m-low"], "b": ["b-high", "b-low"]}
    assert {j.kind: j.priority for j in claimed} == {"m-high": 9, "m-low": 0, "b-high": 9, "b-low": 0}


def test_a_delayed_job_and_a_retried_one_keep_their_priority(conn: psycopg.Connection[Any], worker: int) -> None:
    urgent = fairqueue.enqueue(conn, "urgent", channel="acme", priority=10, delay=3600)
    failing = fairqueue.enqueue(conn, "failing", channel="acme", priority=20)
    fairqueue.enqueue(conn, "plain", channel="acme")
    [first] = fairqueue.claim_batch(conn, worker, 1)
    assert first.id == failing
    fairqueue.finish(conn, worker, [Outcome(failing, "failed", error="boom", retry_in=0)])  # retried at once
    conn.execute("UPDATE fairqueue.scheduled_job SET run_at = now() WHERE job_id = %s", (urgent,))  # due now
    assert _claim_kinds(conn, worker, 10) == ["failing", "urgent", "plain"]


def test_an_operators_retry_keeps_the_priority(conn: psycopg.Connection[Any], worker: int) -> None:
    job = fairqueue.enqueue(conn, "again", channel="acme", priority=7, max_attempts=1)
    [claimed] = fairqueue.claim_batch(conn, worker, 1)
    fairqueue.fail(conn, worker, claimed.id, error="boom")
    fairqueue.enqueue(conn, "plain", channel="acme")
    assert fairqueue.retry(conn, job) == "retried"
    conn.execute("UPDATE fairqueue.scheduled_job SET run_at = now() WHERE job_id = %s", (job,))
    again = fairqueue.claim_batch(conn, worker, 10)
    assert [(j.kind, j.priority) for j in again] == [("again", 7), ("plain", 0)]


def test_a_fifo_key_keeps_enqueue_order_whatever_the_priorities(conn: psycopg.Connection[Any], worker: int) -> None:
    first = fairqueue.enqueue(conn, "first", channel="acme", fifo_key="acct", priority=-50)
    fairqueue.enqueue(conn, "second", channel="acme", fifo_key="acct", priority=50)
    assert _claim_kinds(conn, worker, 10) == ["first"]  # the second waits for the key, priority or not
    fairqueue.complete(conn, worker, first)
    assert _claim_kinds(conn, worker, 10) == ["second"]


def test_a_capped_channel_spends_its_slots_on_its_highest_priorities(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_channel(conn, "acme", max_concurrency=2)
    for kind, priority in [("p0", 0), ("p5", 5), ("p1", 1), ("p9", 9)]:
        fairqueue.enqueue(conn, kind, channel="acme", priority=priority)
    assert _claim_kinds(conn, worker, 10) == ["p9", "p5"]


@pytest.mark.parametrize("priority", [101, -101, 1.5, "1", True, None])
def test_a_priority_out_of_range_is_refused_before_writing(conn: psycopg.Connection[Any], priority: Any) -> None:
    with pytest.raises(fairqueue.InvalidJobError, match="priority must be a whole number from -100 to 100"):
        fairqueue.enqueue(conn, "k", priority=priority)
    with pytest.raises(fairqueue.InvalidJobError, match="priority must be a whole number from -100 to 100"):
        fairqueue.enqueue_many(conn, [{"kind": "k", "priority": priority}])
    assert conn.execute("SELECT count(*) FROM fairqueue.job").fetchone() == (0,)


def test_the_sql_function_refuses_a_priority_out_of_range(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="priority must be from -100 to 100"):
        conn.execute(
            "SELECT * FROM fairqueue.enqueue('k', '{}', 'c', NULL, NULL, NULL, NULL, NULL, NULL, 101::smallint)"
        )
