"""Revision fq0016 lets an intake that finds a job's shared limit row busy leave a limit_release row
naming the job, for the next holder of the row to put it in the line. Going back to fq0015 drops
those columns: the job stays in scheduled_job, due within a second, and is gated again then, as
fq0015 does (nothing is lost)."""

from __future__ import annotations

import psycopg

import fairqueue
from fairqueue import migrations
from tests.helpers import wait_for


def test_a_job_named_for_the_line_when_going_back_is_gated_again(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url)
    with (
        psycopg.connect(empty_database_url, autocommit=True) as conn,
        psycopg.connect(empty_database_url, autocommit=True) as other,
    ):
        worker = fairqueue.register_worker(conn, "w", lease_seconds=300)
        fairqueue.configure_limit(conn, "api", max_concurrency=1)
        with other.transaction():  # another transaction holds the limit's row
            other.execute("SELECT 1 FROM fairqueue.shared_limit WHERE name = 'api' FOR NO KEY UPDATE")
            job = fairqueue.enqueue(conn, "k", channel="acme", limits=["api"])
            assert fairqueue.claim_batch(conn, worker, 5) == []
        assert conn.execute("SELECT job_id FROM fairqueue.limit_release").fetchall() == [(job,)]

        migrations.downgrade(empty_database_url, "fq0015")
        row = conn.execute(
            "SELECT placed, run_at <= now() + interval '1 second' FROM fairqueue.scheduled_job WHERE job_id = %s",
            (job,),
        ).fetchone()
        assert row == (True, True)
        # the fallback: once due, the intake gates it again, and it gets the free slot
        claimed = wait_for(lambda: fairqueue.claim_batch(conn, worker, 5), timeout=10, what="the job to run")
        assert [j.id for j in claimed] == [job]
        assert conn.execute("SELECT held FROM fairqueue.shared_limit").fetchone() == (1,)
