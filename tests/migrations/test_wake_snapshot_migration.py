"""Revision fq0024: the intake locks the channels it wakes in a statement of its own and reads them with a
snapshot taken after. At fq0023 a claimer that idled a channel between the wake statement's snapshot and its
lock left the channel idle with the woken key in turn, and the key's jobs never ran; from fq0024 on the intake
wakes the channel it locked. Down again, the old statement (and its race) is back."""

from __future__ import annotations

from typing import Any

import psycopg

import fairqueue
from fairqueue import migrations
from tests.conftest import Connections
from tests.helpers import race_against_intake_lock


def _runs_after_a_claim_idles_its_channel(
    connect: Connections, conn: psycopg.Connection[Any], worker: int, channel: str
) -> bool:
    """A key at its cap in ``channel`` gets a slot back while an intake wakes it and a claim idles the
    channel; returns whether the key's next job runs. Leaves no job of ``channel`` behind."""
    fairqueue.configure_channel(conn, channel, key_max_concurrency=1)
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec("k", channel=channel, fair_key="a") for _ in range(2)])
    (first,) = fairqueue.claim_batch(conn, worker, 1)
    fairqueue.finish(conn, worker, [fairqueue.Outcome(first.id)])
    race_against_intake_lock(connect, conn, lambda: fairqueue.claim_batch(connect(), worker, 5))
    jobs = fairqueue.claim_batch(conn, worker, 5)
    if not jobs:  # stranded: clean up, so the next step starts from nothing
        conn.execute("UPDATE fairqueue.channel SET active = true, keyed = true WHERE name = %s", (channel,))
        jobs = fairqueue.claim_batch(conn, worker, 5)
        assert len(jobs) == 1
        fairqueue.finish(conn, worker, [fairqueue.Outcome(jobs[0].id)])
        return False
    fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in jobs])
    return True


def test_the_intake_wakes_the_channel_a_claim_idled_before_its_lock_from_fq0024_on(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    migrations.upgrade(url, "fq0023")
    connect = Connections(url)
    try:
        conn = connect()
        worker = fairqueue.register_worker(conn, "w", lease_seconds=60)
        assert _runs_after_a_claim_idles_its_channel(connect, conn, worker, "before") is False
        migrations.upgrade(url)
        assert _runs_after_a_claim_idles_its_channel(connect, conn, worker, "up") is True
        migrations.downgrade(url, "fq0023")
        assert _runs_after_a_claim_idles_its_channel(connect, conn, worker, "down") is False
    finally:
        connect.close_all()
