"""Revision fq0020 changes only functions: a job added to a fair key already in turn is written
without a wakeup, and a claim lets a dry key go only with the key's lock. The turns (channel_key)
keep their form, so keys put in turn by one revision are served by the other, in either direction."""

from __future__ import annotations

from typing import Any

import psycopg

import fairqueue
from fairqueue import migrations


def _key_wakeups(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM fairqueue.channel_wakeup WHERE fair_key IS NOT NULL").fetchone()
    assert row is not None
    return int(row[0])


def _claim_kinds(conn: psycopg.Connection[Any], worker: int) -> list[str]:
    return [j.kind for j in fairqueue.claim_batch(conn, worker, 10)]


def _key_in_turn(conn: psycopg.Connection[Any], worker: int, key: str) -> None:
    """acme's key ``key`` in turn with two ready jobs, key1 and key2 (key0 was claimed and finished)."""
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec(f"{key}{i}", channel="acme", fair_key=key) for i in range(3)])
    (first,) = fairqueue.claim_batch(conn, worker, 1)
    fairqueue.finish(conn, worker, [fairqueue.Outcome(first.id)])
    assert _key_wakeups(conn) == 0


def test_keys_in_turn_before_the_upgrade_are_served_after_it_and_back(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url, "fq0019")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        worker = fairqueue.register_worker(conn, "w", lease_seconds=300)
        _key_in_turn(conn, worker, "a")  # put in turn by fq0019

        migrations.upgrade(empty_database_url)
        fairqueue.enqueue(conn, "a3", channel="acme", fair_key="a")
        assert _key_wakeups(conn) == 0  # a is in turn: the job is written alone
        assert _claim_kinds(conn, worker) == ["a1", "a2", "a3"]
        _key_in_turn(conn, worker, "b")  # put in turn by fq0020

        migrations.downgrade(empty_database_url, "fq0019")
        fairqueue.enqueue(conn, "b3", channel="acme", fair_key="b")
        assert _key_wakeups(conn) == 1  # fq0019 wakes the key all the same
        assert _claim_kinds(conn, worker) == ["b1", "b2", "b3"]

        migrations.upgrade(empty_database_url)
        fairqueue.enqueue(conn, "c0", channel="acme", fair_key="c")
        assert _key_wakeups(conn) == 1  # a key not in turn is woken
        assert _claim_kinds(conn, worker) == ["c0"]
        assert fairqueue.claim_batch(conn, worker, 10) == []
