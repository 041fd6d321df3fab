"""enqueue_dataframe(fair_key_col=...): a column of fair keys, checked on the driver, stored on the jobs,
and part of a run's content (other keys are another run; a run without keys keeps its run id, batches
and digests as they were before fair keys)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue.bulk import BulkEnqueueError
from fairqueue.spark import enqueue_dataframe
from tests.helpers import count

pytestmark = pytest.mark.spark

#: The run id and the batches' digests of UNKEYED_ROWS without fair keys, as fairqueue computed them
#: before fair keys existed (commit 569cf47): a run enqueued then still matches its ledger.
UNKEYED_RUN_ID = "df-560b0a04677717f04c0f298d79e1b8ba"
UNKEYED_DIGESTS = [("0-0", "97d47bfe3bcc3f1691ce572dab54434a")]


def _rows(spark: Any, n: int = 12) -> Any:
    from pyspark.sql import functions as F

    return spark.range(n).select(
        F.when(F.col("id") < n // 2, "acme").otherwise("globex").alias("tenant"),
        F.col("id").alias("n"),
        F.concat(F.lit("user-"), (F.col("id") % 3).cast("string")).alias("user"),
        F.when(F.col("id") % 4 == 0, None)
        .otherwise(F.concat(F.lit("u"), (F.col("id") % 2).cast("string")))
        .alias("sometimes"),
    )


def _ledger(conn: psycopg.Connection[Any], run_id: str) -> list[tuple[str, str]]:
    return [
        (r[0], r[1])
        for r in conn.execute(
            "SELECT batch_key, digest FROM fairqueue.bulk_batch WHERE run_id = %s ORDER BY batch_key", (run_id,)
        )
    ]


def test_the_keys_of_a_column_are_stored_on_the_jobs(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any], worker: int
) -> None:
    result = enqueue_dataframe(
        _rows(spark), spark_url, kind="k", channel_col="tenant", args_cols=["n"], fair_key_col="sometimes"
    )
    assert (result.rows, result.inserted) == (12, 12)
    stored = conn.execute(
        "SELECT (j.args->>'n')::int, j.fair_key, r.fair_key FROM fairqueue.job j "
        "JOIN fairqueue.running_job r ON r.job_id = j.id ORDER BY 1"
    ).fetchall()
    assert stored == [(n, None if n % 4 == 0 else f"u{n % 2}", None if n % 4 == 0 else f"u{n % 2}") for n in range(12)]
    # within a channel, the keys (and the jobs without one) take turns: acme's first three are one of each
    first = [j.id for j in fairqueue.claim_batch(conn, worker, 6) if j.channel == "acme"]
    keys = conn.execute("SELECT fair_key FROM fairqueue.job WHERE id = ANY(%s)", (first,)).fetchall()
    assert Counter(k for (k,) in keys) == {None: 1, "u0": 1, "u1": 1}


def test_other_keys_are_other_content(spark: Any, spark_url: str, conn: psycopg.Connection[Any]) -> None:
    df = _rows(spark)
    by_user = enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", args_cols=["n"], fair_key_col="user")
    again = enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", args_cols=["n"], fair_key_col="user")
    assert again.run_id == by_user.run_id and again.inserted == 0 and again.already_present == 12
    other = enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", args_cols=["n"], fair_key_col="sometimes")
    unkeyed = enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", args_cols=["n"])
    assert len({by_user.run_id, other.run_id, unkeyed.run_id}) == 3
    assert (other.inserted, unkeyed.inserted) == (12, 12)
    # the same rows with other keys under a run id that holds them already: changed content
    with pytest.raises(BulkEnqueueError, match="different content"):
        enqueue_dataframe(
            df,
            spark_url,
            kind="k",
            channel_col="tenant",
            args_cols=["n"],
            fair_key_col="sometimes",
            run_id=by_user.run_id,
        )
    assert count(conn, "job") == 36


def test_a_run_without_keys_keeps_its_run_id_and_digests(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any]
) -> None:
    result = enqueue_dataframe(_rows(spark), spark_url, kind="k", channel_col="tenant", args_cols=["n", "user"])
    assert result.run_id == UNKEYED_RUN_ID
    assert _ledger(conn, result.run_id) == UNKEYED_DIGESTS


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "fair_key must be 1 to 255 characters long, got 0"),
        ("x" * 256, "fair_key must be 1 to 255 characters long, got 256"),
        ("nul\x00", "fair_key must not contain NUL characters"),
        ("user\n1", "fair_key must not contain control characters"),
        ("user\x9b", "fair_key must not contain control characters"),
    ],
)
def test_a_bad_key_is_rejected_on_the_driver(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any], key: str, message: str
) -> None:
    df = spark.createDataFrame([("acme", 1, "fine"), ("acme", 2, key)], "tenant string, n long, user string")
    with pytest.raises(fairqueue.InvalidJobError, match=f"1 of 2 rows cannot be enqueued.*{message}"):
        enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", args_cols=["n"], fair_key_col="user")
    assert count(conn, "job") == 0 and count(conn, "bulk_run") == 0


def test_the_key_column_must_be_a_string_column(spark: Any, spark_url: str, conn: psycopg.Connection[Any]) -> None:
    df = _rows(spark)
    with pytest.raises(fairqueue.InvalidJobError, match="fair_key_col: column 'n' has type bigint, not string"):
        enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", fair_key_col="n")
    with pytest.raises(fairqueue.InvalidJobError, match="fair_key_col: the DataFrame has no column 'nope'"):
        enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", fair_key_col="nope")
    assert count(conn, "job") == 0
