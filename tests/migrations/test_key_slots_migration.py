"""Revision fq0025: in a channel without a cap per fair key, the keys take turns by slots their ready
jobs carry, and their rows in channel_key go. The upgrade gives each key's ready jobs slots from where
the key stood in its channel's turns, in priority then enqueue order; a channel that caps its keys keeps
its rows. The downgrade gives every key with ready jobs its row back, in turn. Either way every job is
claimed, and the keys keep alternating."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg

import fairqueue
from fairqueue import migrations
from tests.helpers import assert_consistent


def _keys(conn: psycopg.Connection[Any], worker: int, n: int) -> Counter[str | None]:
    return Counter(j.fair_key for j in fairqueue.claim_batch(conn, worker, n))


def test_keys_in_turn_keep_their_turns_across_the_upgrade_and_back(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url, "fq0024")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        worker = fairqueue.register_worker(conn, "w", lease_seconds=300)
        fairqueue.configure_channel(conn, "capped", key_max_concurrency=5)
        fairqueue.enqueue_many(
            conn,
            [fairqueue.JobSpec("k", channel="acme", fair_key="a")] * 6
            + [fairqueue.JobSpec("k", channel="acme", fair_key="b")] * 6,
        )
        assert _keys(conn, worker, 4) == {"a": 2, "b": 2}  # a and b in turn, each charged 2
        # c waits for the next intake to put it in turn; so does capped's key x
        fairqueue.enqueue_many(conn, [fairqueue.JobSpec("k", channel="acme", fair_key="c")] * 3)
        fairqueue.enqueue_many(conn, [fairqueue.JobSpec("k", channel="capped", fair_key="x")] * 4)
        conn.execute("SELECT fairqueue.promote_due_jobs()")  # (an intake: c and x in turn)
        rows_before = conn.execute("SELECT channel, fair_key FROM fairqueue.channel_key ORDER BY 1, 2").fetchall()
        assert ("acme", "c") in rows_before and ("capped", "x") in rows_before

        migrations.upgrade(empty_database_url)
        assert conn.execute("SELECT channel, fair_key FROM fairqueue.channel_key ORDER BY 1, 2").fetchall() == [
            ("capped", "x")
        ]
        assert conn.execute(
            "SELECT count(*) FROM fairqueue.running_job WHERE worker_id IS NULL AND fair_key IS NOT NULL "
            "AND key_slot IS NULL"
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT name, slotted FROM fairqueue.channel_active WHERE name IN ('acme', 'capped') ORDER BY 1"
        ).fetchall() == [("acme", True), ("capped", False)]
        assert_consistent(conn)
        # a, b and c alternate from where they stood (c joined at a and b's turn), x has its own channel
        taken = _keys(conn, worker, 12)
        assert taken == {"a": 3, "b": 3, "c": 2, "x": 4}
        fairqueue.enqueue_many(conn, [fairqueue.JobSpec("k", channel="acme", fair_key="d")] * 3)
        assert_consistent(conn)

        migrations.downgrade(empty_database_url, "fq0024")
        in_turn = conn.execute(
            "SELECT fair_key FROM fairqueue.channel_key WHERE channel = 'acme' AND in_turn ORDER BY 1"
        ).fetchall()
        assert in_turn == [("a",), ("b",), ("c",), ("d",)]
        assert _keys(conn, worker, 100) == {"a": 1, "b": 1, "c": 1, "d": 3}
        assert fairqueue.claim_batch(conn, worker, 100) == []
