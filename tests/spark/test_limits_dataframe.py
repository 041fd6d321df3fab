"""enqueue_dataframe(limits=[...]): every job of the run counts against the named shared limits and
waits for their slots; names are checked before any Spark work, so an unconfigured one writes
nothing; the limits are part of the run's identity, and a run without them keeps its id."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue.spark import enqueue_dataframe
from tests.helpers import assert_consistent, count

pytestmark = pytest.mark.spark


def test_the_jobs_wait_for_the_slots_of_their_limits(spark: Any, spark_url: str, conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_limit(conn, "stripe-api", max_concurrency=2)
    fairqueue.configure_limit(conn, "mailer", max_concurrency=10)
    df = spark.range(6).selectExpr("concat('c', cast(id % 2 AS string)) AS tenant", "id AS n")
    result = enqueue_dataframe(
        df, spark_url, kind="charge", channel_col="tenant", args_cols=["n"], limits=["stripe-api", "mailer"]
    )
    assert result.inserted == 6
    assert conn.execute("SELECT DISTINCT limits FROM fairqueue.job").fetchall() == [(["mailer", "stripe-api"],)]
    assert count(conn, "running_job") == 0  # their slots come from the intake
    worker = fairqueue.register_worker(conn, "w", lease_seconds=60)
    claimed = fairqueue.claim_batch(conn, worker, 10)
    assert len(claimed) == 2  # two slots: the first jobs took them (in enqueue order), the others wait
    assert_consistent(conn)
    fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in claimed])
    claimed = fairqueue.claim_batch(conn, worker, 10)
    assert sorted(j.channel for j in claimed) == ["c0", "c1"]  # the slots freed go to the tenants in turn
    # the same rows without the limits are another run; with them, the same run (nothing to do)
    again = enqueue_dataframe(
        df, spark_url, kind="charge", channel_col="tenant", args_cols=["n"], limits=["mailer", "stripe-api"]
    )
    plain = enqueue_dataframe(df, spark_url, kind="charge", channel_col="tenant", args_cols=["n"])
    assert again.run_id == result.run_id and again.inserted == 0
    assert plain.run_id != result.run_id and plain.inserted == 6


def test_an_unconfigured_limit_writes_nothing(spark: Any, spark_url: str, conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=2)
    with pytest.raises(fairqueue.InvalidJobError, match=r"^shared limit 'nope' is not configured"):
        enqueue_dataframe(spark.range(3), spark_url, kind="k", limits=["api", "nope"])
    with pytest.raises(fairqueue.InvalidJobError, match=r"^limits must be a list of shared limit names"):
        enqueue_dataframe(spark.range(3), spark_url, kind="k", limits="api")
    assert count(conn, "job") == 0 and count(conn, "bulk_run") == 0
