"""Shared limits through bulk_enqueue and abulk_enqueue (schema fq0021: enqueue_batch takes each job's
limits): the jobs keep their limits and wait for their slots as enqueue_many's do, in chunks and in
runs; a name that is not configured is refused before anything is written, naming the job; a batch
without limits keeps the COPY columns, and so the digest, it always had."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import bulk
from fairqueue.bulk import BatchResult
from tests.conftest import Connections
from tests.helpers import assert_consistent, count


def _limits(conn: psycopg.Connection[Any], channel: str) -> list[Any]:
    return [r[0] for r in conn.execute("SELECT limits FROM fairqueue.job WHERE channel = %s ORDER BY id", (channel,))]


def _jobs(channel: str) -> list[Any]:
    return [
        {"kind": "charge", "channel": channel, "limits": ["stripe-api"]},
        fairqueue.JobSpec("charge", channel=channel, limits=["stripe-api", "mailer"], fair_key="user-1"),
        {"kind": "plain", "channel": channel},
    ]


def test_bulk_jobs_keep_their_limits_and_wait_for_their_slots(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_limit(conn, "stripe-api", max_concurrency=1)
    fairqueue.configure_limit(conn, "mailer", rate_limit="100/s")
    assert fairqueue.bulk_enqueue(conn, _jobs("chunks")) == BatchResult(3, 3)
    assert fairqueue.bulk_enqueue(conn, _jobs("run"), run_id="nightly").created == 3
    again = fairqueue.bulk_enqueue(conn, _jobs("run"), run_id="nightly")  # the same batch: written once
    assert (again.jobs, again.done_before) == (3, True)
    for channel in ("chunks", "run"):
        assert _limits(conn, channel) == [["stripe-api"], ["mailer", "stripe-api"], None], channel
    # Not ready at enqueue (the intake gives them their slots): stripe-api has one slot for four jobs.
    assert count(conn, "running_job") == 2  # the plain ones
    claimed = fairqueue.claim_batch(conn, worker, 10)
    assert sorted(j.kind for j in claimed) == ["charge", "plain", "plain"]
    assert conn.execute("SELECT held FROM fairqueue.shared_limit WHERE name = 'stripe-api'").fetchone() == (1,)
    assert count(conn, "limit_waiting") == 3
    assert_consistent(conn)
    # each job that ends hands its slot on, until every one has run
    done = [j.id for j in claimed]
    while claimed:
        fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in claimed])
        claimed = fairqueue.claim_batch(conn, worker, 10)
        assert len([j for j in claimed if j.kind == "charge"]) <= 1
        done += [j.id for j in claimed]
    assert len(done) == 6 and count(conn, "job") == 0


def test_an_unconfigured_limit_in_a_later_chunk_writes_nothing(connect: Connections, monkeypatch: Any) -> None:
    monkeypatch.setattr(bulk, "CHUNK", 10)
    c = connect(autocommit=False)
    fairqueue.configure_limit(c, "api", max_concurrency=2)
    mine = fairqueue.enqueue(c, "mine")  # the caller's own work in the same transaction stays
    jobs: list[dict[str, Any]] = [{"kind": "k", "limits": ["api"]} for _ in range(25)]
    jobs[23]["limits"] = ["api", "nope"]
    with pytest.raises(fairqueue.InvalidJobError, match=r"^job #23: shared limit 'nope' is not configured"):
        fairqueue.bulk_enqueue(c, jobs)
    with pytest.raises(fairqueue.InvalidJobError, match=r"^job #1: shared limit 'nope' is not configured"):
        fairqueue.bulk_enqueue(c, jobs[22:24], run_id="r")
    assert c.execute("SELECT array_agg(id) FROM fairqueue.job").fetchone() == ([mine],)
    assert count(c, "bulk_batch") == 0
    assert fairqueue.bulk_enqueue(c, jobs[:23]).created == 23  # the transaction goes on
    c.commit()
    assert count(connect(), "job") == 24


def test_a_batch_without_limits_keeps_its_columns_and_digest(conn: psycopg.Connection[Any]) -> None:
    plain = bulk._checked_jobs([{"kind": "k", "channel": "acme", "fair_key": "u"}])
    assert bulk._columns(plain) == bulk.KEYED_COLUMNS  # no limits column: the text, and digest, of before
    limited = bulk._checked_jobs([{"kind": "k", "limits": ["b", "a"]}, {"kind": "k"}])
    assert bulk._columns(limited) == (*bulk.ALL_COLUMNS, "limits")
    assert [line.split("\t")[-1] for line in bulk._copy_text(limited).splitlines()] == ['["a", "b"]', "\\N"]


def test_a_staging_table_made_before_limits_gets_the_column(connect: Connections) -> None:
    """A session whose staging table fairqueue made before fq0021 (through a pooler, say)."""
    conn = connect()
    conn.execute(
        "CREATE TEMPORARY TABLE fairqueue_bulk_stage (kind text, channel text, args jsonb, run_at timestamptz, "
        "max_attempts integer, timeout_seconds double precision, unique_key text, fifo_key text, "
        "depends_on jsonb, priority smallint, fair_key text) ON COMMIT DELETE ROWS"
    )
    fairqueue.configure_limit(conn, "api", max_concurrency=5)
    assert fairqueue.bulk_enqueue(conn, [{"kind": "k", "channel": "t", "limits": ["api"]}]).created == 1
    assert _limits(conn, "t") == [["api"]]


def test_abulk_enqueue_takes_limits(conn: psycopg.Connection[Any], db_url: str) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=5)

    async def calls() -> list[BatchResult]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            job = {"channel": "async", "limits": ["api"]}
            chunks = await fairqueue.abulk_enqueue(aconn, [{"kind": "a", **job}] * 2)
            run = await fairqueue.abulk_enqueue(aconn, [{"kind": "b", **job}], run_id="x")
            with pytest.raises(fairqueue.InvalidJobError, match=r"^job #0: shared limit 'nope' is not configured"):
                await fairqueue.abulk_enqueue(aconn, [{"kind": "c", "channel": "async", "limits": ["nope"]}])
            return [chunks, run]

    assert asyncio.run(calls()) == [BatchResult(2, 2), BatchResult(1, 1, False, None)]
    assert _limits(conn, "async") == [["api"]] * 3
    assert count(conn, "running_job") == 0 and count(conn, "scheduled_job") == 3  # slots come from the intake
