"""Revision fq0023: a claim starts the jobs its intake handed their shared limits' slots in idle channels itself
(the intake takes the claim's room and returns them), and the intake runs each step only when a probe finds work
for it. _intake is dropped and created again with a parameter and a result; claim is replaced in place. Up and
down, a limit's freed slot goes to the next job in line."""

from __future__ import annotations

from typing import Any

import psycopg

import fairqueue
from fairqueue import migrations


def _intake(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT to_regproc('fairqueue._intake')::regprocedure::text").fetchone()
    assert row is not None
    return str(row[0])


def _slot_goes_to_the_next_job(conn: psycopg.Connection[Any], worker: int, channel: str) -> bool:
    """Two jobs of ``channel`` share a limit of one slot: the second runs once the first has finished, through
    an intake that has no wakeup, no due job and no throttle to look at, only the slot given back. Returns
    whether the channel's row was written meanwhile (woken and idled again)."""
    jobs = [
        fairqueue.JobSpec("first", channel=channel, limits=["api"]),
        fairqueue.JobSpec("second", channel=channel, limits=["api"]),
    ]
    fairqueue.enqueue_many(conn, jobs)
    (first,) = fairqueue.claim_batch(conn, worker, 10)
    assert first.kind == "first"
    assert fairqueue.claim_batch(conn, worker, 10) == []  # the other one waits for the slot; the channel idles
    where = "SELECT ctid::text FROM fairqueue.channel WHERE name = %s"
    before = conn.execute(where, (channel,)).fetchone()
    fairqueue.finish(conn, worker, [fairqueue.Outcome(first.id)])
    (second,) = fairqueue.claim_batch(conn, worker, 10)
    assert second.kind == "second"
    written = conn.execute(where, (channel,)).fetchone() != before
    fairqueue.finish(conn, worker, [fairqueue.Outcome(second.id)])
    return written


def test_a_claim_starts_the_jobs_its_intake_handed_out_in_idle_channels_from_fq0023_on(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    migrations.upgrade(url, "fq0022")
    with psycopg.connect(url, autocommit=True) as conn:
        assert _intake(conn) == "fairqueue._intake(timestamp with time zone)"
        fairqueue.configure_limit(conn, "api", max_concurrency=1)
        worker = fairqueue.register_worker(conn, "w", lease_seconds=60)
        assert _slot_goes_to_the_next_job(conn, worker, "before") is True
        migrations.upgrade(url)
        assert _intake(conn) == "fairqueue._intake(timestamp with time zone,integer)"
        assert _slot_goes_to_the_next_job(conn, worker, "up") is False
        migrations.downgrade(url, "fq0022")
        assert _intake(conn) == "fairqueue._intake(timestamp with time zone)"
        assert _slot_goes_to_the_next_job(conn, worker, "down") is True
