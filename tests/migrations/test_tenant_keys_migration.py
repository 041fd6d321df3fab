"""Revision fq0009 scopes unique and FIFO keys to their channel, on databases that already hold jobs."""

from __future__ import annotations

import psycopg
import pytest

import fairqueue
from fairqueue import migrations
from tests.helpers import assert_consistent


def test_a_job_waiting_behind_another_channels_fifo_holder_runs_after_the_upgrade(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url, "fq0008")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        worker = fairqueue.register_worker(conn, "w", lease_seconds=300)
        alice_first = fairqueue.enqueue(conn, "k", channel="alice", fifo_key="acct")
        alice_second = fairqueue.enqueue(conn, "k", channel="alice", fifo_key="acct")
        bob = fairqueue.enqueue(conn, "k", channel="bob", fifo_key="acct")  # the key was global: Bob waits
        [held] = fairqueue.claim_batch(conn, worker, 10)
        assert held.id == alice_first
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
    migrations.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        fairqueue.enqueue(conn, "k", channel="alice", unique_key="invoice-1")
        fairqueue.enqueue(conn, "k", channel="bob", unique_key="invoice-1")
    with pytest.raises(Exception, match="live jobs of two channels hold unique key invoice-1"):
        migrations.downgrade(empty_database_url, "fq0008")
    assert migrations.current_revision(empty_database_url) == migrations.head_revision()
