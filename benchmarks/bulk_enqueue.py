"""Bulk enqueue throughput: enqueue_many vs bulk_enqueue (one process), or enqueue_dataframe (Spark).

    python -m benchmarks.bulk_enqueue [--jobs 100000] [--channels 10] [--database-url URL]
    python -m benchmarks.bulk_enqueue --spark [--rows 1000000] [--master local[2]]

Without --database-url, an embedded PostgreSQL with durable settings runs for the duration.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psycopg

import fairqueue
from benchmarks._common import database
from fairqueue import migrations

RESET = (
    "TRUNCATE fairqueue.job, fairqueue.running_job, fairqueue.channel_wakeup, fairqueue.channel, "
    "fairqueue.bulk_run, fairqueue.bulk_batch"
)


def one_process(url: str, jobs: int, channels: int, repeat: int) -> None:
    specs = [
        {"kind": "bench.job", "channel": f"c{i % channels}", "args": {"n": i, "name": f"row {i}"}} for i in range(jobs)
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        for name, call in (
            ("enqueue_many", lambda: fairqueue.enqueue_many(conn, specs)),
            ("bulk_enqueue", lambda: fairqueue.bulk_enqueue(conn, specs)),
        ):
            best = float("inf")
            for _ in range(repeat):
                conn.execute(RESET)
                conn.execute("CHECKPOINT")
                started = time.perf_counter()
                call()
                best = min(best, time.perf_counter() - started)
                row = conn.execute("SELECT count(*) FROM fairqueue.job").fetchone()
                assert row == (jobs,), row
            print(f"{name:13s} {jobs:,} jobs: best of {repeat} {best:.2f} s = {jobs / best:,.0f} jobs/s")


def spark(url: str, rows: int, master: str) -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from pyspark.sql import functions as F

    from fairqueue.spark import enqueue_dataframe, spark_session

    session = spark_session(master, app_name="fairqueue-bench")
    session.sparkContext.setLogLevel("ERROR")
    share = F.col("id") % 100
    df = session.range(rows).select(
        F.when(share < 60, "big").when(share < 90, "mid").when(share < 99, "small").otherwise("tiny").alias("tenant"),
        F.col("id").alias("order_id"),
        F.concat(F.lit("customer-"), (F.col("id") % 9973).cast("string")).alias("customer"),
    )
    session.range(1000).count()  # the JVM warmed up
    options: dict[str, Any] = {"kind": "orders.sync", "channel_col": "tenant", "args_cols": ["order_id", "customer"]}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RESET)
    first = enqueue_dataframe(df, url, **options)
    print(f"enqueue_dataframe {rows:,} rows ({master}): {first.seconds:.1f} s = {first.rows_per_second:,.0f} rows/s")
    again = enqueue_dataframe(df, url, **options)
    print(f"the same call again: {again.seconds:.1f} s ({again.batches_skipped} of {again.batches} batches skipped)")
    session.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", help="a TCP URL for --spark (default: an embedded PostgreSQL)")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--channels", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spark", action="store_true")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    if args.spark and not args.database_url:
        from fairqueue.embedded import DURABLE_SETTINGS, LocalPostgres, free_tcp_port

        with LocalPostgres(settings=DURABLE_SETTINGS, tcp_port=free_tcp_port()) as server:
            url = server.tcp_url_for("postgres")
            migrations.upgrade(url)
            spark(url, args.rows, args.master)
        return
    with database(args.database_url) as url:
        migrations.upgrade(url)
        if args.spark:
            spark(url, args.rows, args.master)
        else:
            one_process(url, args.jobs, args.channels, args.repeat)


if __name__ == "__main__":
    main()
