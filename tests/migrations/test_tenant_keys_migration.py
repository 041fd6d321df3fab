"""Revision fq0009 scopes unique and FIFO keys to their channel, on databases that already hold jobs.
(The databases are set up at older revisions with SQL of those revisions: today's API needs today's
schema.)"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import migrations
from tests.helpers import assert_consistent

# fairqueue.enqueue and fairqueue.claim as revisions fq0008 and fq0009 define them
ENQUEUE = "SELECT job_id FROM fairqueue.enqueue(%s, '{}', %s, NULL, NULL, NULL, %s, %s)"
CLAIM = "SELECT job_id FROM fairqueue.claim(%s, 10)"


def _enqueue(
    conn: psycopg.Connection[Any], channel: str, *, unique_key: str | None = None, fifo_key: str | None = None
) -> int:
    row = conn.execute(ENQUEUE, ("k", channel, unique_key, fifo_key)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_job_waiting_behind_another_channels_fifo_holder_runs_after_the_upgrade(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url, "fq0008")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        worker = fairqueue.register_worker(conn, "w", lease_seconds=300)
        alice_first = _enqueue(conn, "alice", fifo_key="acct")
        alice_second = _enqueue(conn, "alice", fifo_key="acct")
        bob = _enqueue(conn, "bob", fifo_key="acct")  # the key was global: Bob waits
        assert [r[0] for r in conn.execute(CLAIM, (worker,))] == [alice_first]
        waiting = {r[0] for r in conn.execute("SELECT job_id FROM fairqueue.fifo_waiting")}
        assert waiting == {alice_second, bob}

        migrations.upgrade(empty_database_url)

        waiting = {r[0] for r in conn.execute("SELECT job_id FROM fairqueue.fifo_waiting")}
        assert waiting == {alice_second}  # still behind Alice's holder, in Alice's channel
        [freed] = fairqueue.claim_batch(conn, worker, 10)
        assert freed.id == bob
        assert_consistent(conn)
        fairqueue.complete(conn, worker, alice_first)  # the hand-over within Alice's channel still works
        assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [alice_second]


def test_going_back_to_global_keys_is_refused_while_two_channels_hold_one(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url, "fq0009")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        _enqueue(conn, "alice", unique_key="invoice-1")
        _enqueue(conn, "bob", unique_key="invoice-1")
    with pytest.raises(Exception, match="live jobs of two channels hold unique key invoice-1"):
        migrations.downgrade(empty_database_url, "fq0008")
    assert migrations.current_revision(empty_database_url) == "fq0009"
