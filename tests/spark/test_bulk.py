"""fairqueue.spark.enqueue_dataframe: bulk enqueue from a DataFrame, exactly once, fairly."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue.bulk import BulkEnqueueError
from fairqueue.spark import enqueue_dataframe
from tests.helpers import channel_counts, count, producer_role_for

pytestmark = pytest.mark.spark


def jobs_by_channel(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return dict(conn.execute("SELECT channel, count(*) FROM fairqueue.job GROUP BY channel").fetchall())


def nothing_written(conn: psycopg.Connection[Any]) -> bool:
    return count(conn, "job") == 0 and count(conn, "bulk_run") == 0 and count(conn, "bulk_batch") == 0


@contextlib.contextmanager
def third_batch_of_a_task_fails_once(conn: psycopg.Connection[Any]) -> Iterator[Callable[[], int]]:
    """The first time a Spark task (a writer connection) gets to its third batch, that batch fails:
    the task has committed two batches by then. The per-session counter is a setting (it survives
    the session's committed transactions); the once-only counter a sequence (no rollback undoes it).
    Yields a function that tells how many third batches were attempted."""
    conn.execute("CREATE SEQUENCE public.fq_test_fault")
    conn.execute(
        """
        CREATE FUNCTION public.fq_test_fault() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            v_seen integer := coalesce(nullif(current_setting('fq_test.batches', true), ''), '0')::integer + 1;
        BEGIN
            PERFORM set_config('fq_test.batches', v_seen::text, false);
            IF v_seen = 3 AND nextval('public.fq_test_fault') = 1 THEN
                RAISE EXCEPTION 'injected fault: the first attempt at batch % fails', NEW.batch_key;
            END IF;
            RETURN NEW;
        END $$"""
    )
    conn.execute(
        "CREATE TRIGGER fq_test_fault BEFORE INSERT ON fairqueue.bulk_batch "
        "FOR EACH ROW EXECUTE FUNCTION public.fq_test_fault()"
    )

    def attempts() -> int:
        row = conn.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM public.fq_test_fault").fetchone()
        assert row is not None
        return int(row[0])

    try:
        yield attempts
    finally:
        conn.execute("DROP TRIGGER IF EXISTS fq_test_fault ON fairqueue.bulk_batch")
        conn.execute("DROP FUNCTION IF EXISTS public.fq_test_fault()")
        conn.execute("DROP SEQUENCE IF EXISTS public.fq_test_fault")


def numbered(spark: Any, n: int, channels: int = 3) -> Any:
    from pyspark.sql import functions as F

    return spark.range(n).select(
        F.concat(F.lit("c"), (F.col("id") % channels).cast("string")).alias("tenant"),
        F.col("id").alias("n"),
        F.concat(F.lit("row "), F.col("id").cast("string")).alias("label"),
    )


# -- the acceptance test -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_million_rows_land_exactly_once_through_a_failed_task_and_a_rerun(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any], worker: int
) -> None:
    from pyspark.sql import functions as F

    rows = 1_000_000
    # several channels of very different sizes: 60%, 30%, 9%, 1%
    share = F.col("id") % 100
    df = spark.range(rows).select(
        F.when(share < 60, "big").when(share < 90, "mid").when(share < 99, "small").otherwise("tiny").alias("tenant"),
        F.col("id").alias("order_id"),
        F.concat(F.lit("customer-"), (F.col("id") % 9973).cast("string")).alias("customer"),
    )
    with third_batch_of_a_task_fails_once(conn) as attempts:
        result = enqueue_dataframe(
            df, spark_url, kind="orders.sync", channel_col="tenant", args_cols=["order_id", "customer"]
        )
        assert attempts() >= 1  # the fault fired (the first third batch always fails)
    print(f"\nenqueue_dataframe: {rows:,} rows in {result.seconds:.1f} s = {result.rows_per_second:,.0f} rows/s")
    assert count(conn, "job") == rows == result.rows == result.inserted
    assert (result.already_enqueued, result.duplicates, result.batches_skipped) == (0, 0, 0)
    assert jobs_by_channel(conn) == {"big": 600_000, "mid": 300_000, "small": 90_000, "tiny": 10_000}
    assert count(conn, "running_job") == rows
    ledger = conn.execute("SELECT count(*), sum(jobs), max(jobs) FROM fairqueue.bulk_batch").fetchone()
    assert ledger is not None and ledger[:2] == (result.batches, rows) and ledger[2] <= 10_000
    assert conn.execute("SELECT count(DISTINCT args->>'order_id') FROM fairqueue.job").fetchone() == (rows,)
    # 600,000 jobs of "big" do not hold up the 10,000 of "tiny"
    assert channel_counts(fairqueue.claim_batch(conn, worker, 4)) == {"big": 1, "mid": 1, "small": 1, "tiny": 1}

    again = enqueue_dataframe(
        df, spark_url, kind="orders.sync", channel_col="tenant", args_cols=["order_id", "customer"]
    )
    print(f"the same call again: {again.seconds:.1f} s, all {again.batches_skipped} batches skipped")
    assert again.run_id == result.run_id
    assert (again.inserted, again.already_enqueued, again.batches_skipped) == (0, rows, result.batches)
    assert count(conn, "job") == rows


# -- exactly once ----------------------------------------------------------------------------------------


def test_a_task_failing_after_some_batches_is_retried_without_duplicates(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any]
) -> None:
    rows, batch_size = 20_000, 500
    df = numbered(spark, rows)
    with third_batch_of_a_task_fails_once(conn) as attempts:
        result = enqueue_dataframe(
            df, spark_url, kind="k", channel_col="tenant", args_cols=["n"], batch_size=batch_size
        )
        assert attempts() >= 1  # the fault fired
    assert count(conn, "job") == rows == result.inserted
    assert conn.execute("SELECT count(DISTINCT (args->>'n')::int) FROM fairqueue.job").fetchone() == (rows,)
    assert conn.execute("SELECT count(DISTINCT call_id) FROM fairqueue.bulk_batch").fetchone() == (1,)


def test_the_same_data_in_another_partitioning_is_the_same_run(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any]
) -> None:
    df = numbered(spark, 5_000)
    first = enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", args_cols=["n", "label"], batch_size=700)
    shuffled = df.repartition(7).orderBy("label")
    second = enqueue_dataframe(
        shuffled, spark_url, kind="k", channel_col="tenant", args_cols=["n", "label"], batch_size=700
    )
    assert second.run_id == first.run_id
    assert (second.inserted, second.already_enqueued) == (0, 5_000)
    assert count(conn, "job") == 5_000
    # another kind (or other data) is another run
    other = enqueue_dataframe(df, spark_url, kind="k2", channel_col="tenant", args_cols=["n"], batch_size=700)
    assert other.run_id != first.run_id and other.inserted == 5_000


def test_a_named_run_is_resumed_by_name(spark: Any, spark_url: str, conn: psycopg.Connection[Any]) -> None:
    df = numbered(spark, 3_000)
    first = enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", args_cols=["n"], run_id="import-1")
    assert first.run_id == "import-1" and first.inserted == 3_000
    again = enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", args_cols=["n"], run_id="import-1")
    assert again.inserted == 0 and again.already_present == 3_000
    run = conn.execute("SELECT kind, row_count, finished_at IS NOT NULL FROM fairqueue.bulk_run").fetchone()
    assert run == ("k", 3_000, True)


# -- what the jobs look like ------------------------------------------------------------------------------


def test_rows_become_jobs_with_their_args_channel_and_options(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any]
) -> None:
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("tenant", T.StringType()),
            T.StructField("id", T.LongType()),
            T.StructField("name", T.StringType()),
            T.StructField("score", T.DoubleType()),
            T.StructField("day", T.DateType()),
            T.StructField("tags", T.ArrayType(T.StringType())),
            T.StructField("extra", T.MapType(T.StringType(), T.IntegerType())),
        ]
    )
    data = [
        ("acme", 1, 'tab\there "quoted" \\ back\nslash', 1.5, date(2026, 1, 2), ["a", "b"], {"x": 1}),
        ("back\\slash co", 2, None, None, None, None, None),
    ]
    df = spark.createDataFrame(data, schema)
    result = enqueue_dataframe(
        df,
        spark_url,
        kind="crm.sync",
        channel_col="tenant",
        args_cols={"customer_id": "id", "name": "name", "score": "score", "day": "day", "tags": "tags", "x": "extra"},
        max_attempts=7,
        timeout=30,
    )
    assert (result.rows, result.inserted, result.batches) == (2, 2, 1)
    jobs = {
        r[0]: r[1:]
        for r in conn.execute(
            "SELECT channel, kind, args::text, max_attempts, timeout_seconds FROM fairqueue.job"
        ).fetchall()
    }
    assert json.loads(jobs["acme"][1]) == {
        "customer_id": 1,
        "name": 'tab\there "quoted" \\ back\nslash',
        "score": 1.5,
        "day": "2026-01-02",
        "tags": ["a", "b"],
        "x": {"x": 1},
    }
    assert json.loads(jobs["back\\slash co"][1]) == {
        "customer_id": 2,
        "name": None,
        "score": None,
        "day": None,
        "tags": None,
        "x": None,
    }
    assert jobs["acme"][0] == "crm.sync" and jobs["acme"][2:] == (7, 30.0)


def test_a_constant_channel_and_no_args(spark: Any, spark_url: str, conn: psycopg.Connection[Any]) -> None:
    result = enqueue_dataframe(spark.range(10), spark_url, kind="ping", channel="ops")
    assert result.inserted == 10
    # ten identical rows are ten jobs
    assert conn.execute("SELECT channel, args::text, count(*) FROM fairqueue.job GROUP BY 1, 2").fetchall() == [
        ("ops", "{}", 10)
    ]


def test_the_jobs_carry_the_trace_context_current_on_the_driver(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any], spans: Any
) -> None:
    from opentelemetry import trace

    with trace.get_tracer("tests.spark").start_as_current_span("nightly import") as span:
        enqueue_dataframe(spark.range(3), spark_url, kind="ping", channel="ops")
    context = span.get_span_context()
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    stored = conn.execute("SELECT DISTINCT trace_context->>'traceparent' FROM fairqueue.job").fetchall()
    assert stored == [(traceparent,)]


def test_unique_keys_dedupe_against_unfinished_jobs_and_within_the_dataframe(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any]
) -> None:
    held = fairqueue.enqueue(conn, "invoice.send", {"v": "old"}, channel="acme", unique_key="inv-1")
    df = spark.createDataFrame(
        [("acme", "inv-1", "new"), ("acme", "inv-2", "a"), ("acme", "inv-2", "b"), ("beta", "inv-3", "c")],
        "tenant string, invoice string, v string",
    )
    result = enqueue_dataframe(
        df, spark_url, kind="invoice.send", channel_col="tenant", args_cols=["v"], unique_key_col="invoice"
    )
    assert (result.rows, result.inserted, result.duplicates, result.already_present) == (4, 2, 2, 2)
    rows = conn.execute("SELECT unique_key, id, args->>'v' FROM fairqueue.job ORDER BY unique_key").fetchall()
    assert [r[0] for r in rows] == ["inv-1", "inv-2", "inv-3"]
    assert rows[0][1:] == (held, "old")
    # once the held job has ended, its key is free again: a new run enqueues it
    fairqueue.cancel(conn, held)
    later = enqueue_dataframe(
        df, spark_url, kind="invoice.send", channel_col="tenant", args_cols=["v"], unique_key_col="invoice", run_id="2"
    )
    assert later.inserted == 1 and later.duplicates == 3


# -- fairness ------------------------------------------------------------------------------------------


def test_channels_of_very_different_sizes_are_served_fairly_after_a_bulk_enqueue(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any], worker: int
) -> None:
    from pyspark.sql import functions as F

    df = spark.range(30_303).select(
        F.when(F.col("id") < 30_000, "big").when(F.col("id") < 30_300, "mid").otherwise("small").alias("tenant"),
        F.col("id"),
    )
    enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", args_cols=["id"], batch_size=2_000)
    assert channel_counts(fairqueue.claim_batch(conn, worker, 3)) == {"big": 1, "mid": 1, "small": 1}
    served = channel_counts(fairqueue.claim_batch(conn, worker, 30))
    assert served["small"] == 2 and abs(served["big"] - served["mid"]) <= 1  # small had 3 jobs in all


# -- bad input ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kind": ""}, "kind must be 1 to 255 characters long"),
        ({"kind": "k" * 256}, "kind must be 1 to 255 characters long"),
        ({"kind": "k", "channel_col": "nope"}, "has no column 'nope'"),
        ({"kind": "k", "args_cols": ["n", "missing"]}, "has no column 'missing'"),
        ({"kind": "k", "args_cols": "n"}, "args_cols must be a list"),
        ({"kind": "k", "channel_col": "n"}, "has type bigint, not string"),
        ({"kind": "k", "unique_key_col": "n"}, "has type bigint, not string"),
        ({"kind": "k", "channel": ""}, "channel must be 1 to 200 characters long"),
        ({"kind": "k", "max_attempts": 0}, "max_attempts must be a whole number"),
        ({"kind": "k", "timeout": -1}, "timeout must be more than zero"),
        ({"kind": "k", "batch_size": 0}, "batch_size must be a whole number"),
        ({"kind": "k", "run_id": ""}, "run_id must be 1 to 255 characters long"),
    ],
)
def test_bad_arguments_are_rejected_before_anything_is_written(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(fairqueue.InvalidJobError, match=message):
        enqueue_dataframe(numbered(spark, 10), spark_url, **options)
    assert nothing_written(conn)


@pytest.mark.parametrize(
    ("select", "message"),
    [
        ("CASE WHEN n = 7 THEN NULL ELSE tenant END AS tenant, n", "1 of 100 rows .* channel is null"),
        ("CASE WHEN n % 10 = 7 THEN '' ELSE tenant END AS tenant, n", "10 of 100 rows .* channel must be 1 to 200"),
        ("repeat('x', 201) AS tenant, n", "100 of 100 rows .* channel must be 1 to 200 characters long, got 201"),
        ("tenant, CASE WHEN n = 3 THEN double('NaN') ELSE double(n) END AS n", "NaN or an infinite number"),
        ("tenant, array(double(n), double('inf')) AS n", "NaN or an infinite number"),
        (
            "tenant, CASE WHEN n = 5 THEN repeat('y', 300) ELSE 'ok' END AS n",
            "takes 308 bytes as JSON, above the limit of 300",
        ),
        ("tenant, concat('a', char(0), 'b') AS n", "NUL character"),
        ("tenant, unhex('00ff') AS n", "has type binary, which has no JSON form"),
        ("tenant, map(n, 'x') AS n", "is a map with bigint keys: JSON object keys must be strings"),
    ],
)
def test_bad_rows_are_rejected_on_the_driver_before_anything_is_written(
    spark: Any,
    spark_url: str,
    conn: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
    select: str,
    message: str,
) -> None:
    monkeypatch.setattr(fairqueue.settings, "max_args_bytes", 300)
    df = numbered(spark, 100).selectExpr(*[part.strip() for part in _split_select(select)])
    with pytest.raises(fairqueue.InvalidJobError, match=message):
        enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", args_cols=["n"])
    assert nothing_written(conn)


def _split_select(select: str) -> list[str]:
    """Splits a select list at its top-level commas."""
    parts, depth, current = [], 0, ""
    for char in select:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def test_a_bad_unique_key_is_rejected_on_the_driver(spark: Any, spark_url: str, conn: psycopg.Connection[Any]) -> None:
    df = numbered(spark, 20).selectExpr("tenant", "CASE WHEN n = 4 THEN '' ELSE label END AS key")
    with pytest.raises(fairqueue.InvalidJobError, match=r"1 of 20 rows .* unique_key must be 1 to 255"):
        enqueue_dataframe(df, spark_url, kind="k", channel_col="tenant", unique_key_col="key")
    assert nothing_written(conn)


def test_a_row_gone_bad_on_an_executor_fails_the_call_and_a_rerun_completes_it(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """The data the executors write is not what the driver checked (a source that changed between
    the two passes): the call fails naming the row's problem and what was committed; the committed
    batches stay; once the data is right again, the same call enqueues the rest, exactly once."""
    from pyspark.sql import functions as F

    flag = tmp_path / "corrupt"
    flag.touch()
    path = str(flag)

    def tenant(n: int) -> str:
        import os

        from pyspark import TaskContext

        context = TaskContext.get()
        writing = "write run" in ((context and context.getLocalProperty("spark.job.description")) or "")
        return "" if n == 4_321 and writing and os.path.exists(path) else f"c{n % 3}"

    tenant_udf = F.udf(tenant, "string", useArrow=False).asNondeterministic()
    df = spark.range(12_000).select(tenant_udf("id").alias("tenant"), F.col("id").alias("n"))
    options: dict[str, Any] = {"kind": "k", "channel_col": "tenant", "args_cols": ["n"], "batch_size": 500}
    with pytest.raises(BulkEnqueueError) as failed:
        enqueue_dataframe(df, spark_url, **options)
    message = str(failed.value)
    assert "InvalidJobError: a row of batch" in message
    assert "channel must be 1 to 200 characters long, got 0" in message
    run_id = failed.value.run_id
    assert run_id is not None and f"run_id={run_id!r}" in message
    committed = conn.execute("SELECT count(*), coalesce(sum(jobs), 0) FROM fairqueue.bulk_batch").fetchone()
    assert committed is not None and committed[0] > 0 and f"{committed[0]} batch(es) holding" in message
    assert count(conn, "job") == committed[1] < 12_000  # committed batches stay, and nothing else

    flag.unlink()  # the source is right again
    result = enqueue_dataframe(df, spark_url, **options)
    assert result.run_id == run_id
    assert result.already_enqueued == committed[1] and result.inserted == 12_000 - committed[1]
    assert count(conn, "job") == 12_000
    assert conn.execute("SELECT count(DISTINCT (args->>'n')::int) FROM fairqueue.job").fetchone() == (12_000,)


def test_an_unmigrated_database_is_a_configuration_error(spark: Any, spark_url: str, conn: Any) -> None:
    conn.execute("ALTER FUNCTION fairqueue.enqueue_batch RENAME TO enqueue_batch_hidden")
    try:
        with pytest.raises(fairqueue.ConfigurationError, match="fairqueue migrate"):
            enqueue_dataframe(numbered(spark, 5), spark_url, kind="k", channel_col="tenant")
    finally:
        conn.execute("ALTER FUNCTION fairqueue.enqueue_batch_hidden RENAME TO enqueue_batch")


def test_a_producer_role_can_bulk_enqueue_a_dataframe(
    spark: Any, spark_url: str, conn: psycopg.Connection[Any], db_url: str
) -> None:
    from tests.helpers import as_role

    with producer_role_for(conn, db_url) as role:
        url = as_role(spark_url, role)  # the driver and every task connect as the producer
        result = enqueue_dataframe(numbered(spark, 2_000), url, kind="k", channel_col="tenant", args_cols=["n"])
        assert result.inserted == count(conn, "job") == 2_000
        again = enqueue_dataframe(numbered(spark, 2_000), url, kind="k", channel_col="tenant", args_cols=["n"])
        assert again.inserted == 0 and again.already_enqueued == 2_000
