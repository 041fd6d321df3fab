"""Bulk enqueue throughput: enqueue_many vs bulk_enqueue (one process), or enqueue_dataframe (Spark).

    python -m benchmarks.bulk_enqueue [--jobs 100000] [--channels 10] [--repeat 3] [--quick] [--no-doc]
    python -m benchmarks.bulk_enqueue --spark [--rows 1000000] [--master local[2]]

Without --database-url, an embedded PostgreSQL with durable settings runs for the duration. Each
method enqueues --jobs jobs (args {"n": i, "name": "row i"}, spread over --channels channels) in one
call, in a fresh database after a CHECKPOINT, --repeat times; the best time counts. The floor is the
hand-written loop's table filled with one COPY of the same rows. Target: bulk_enqueue at least
100,000 jobs/s. (--spark prints enqueue_dataframe's rate and records nothing.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import psycopg

import fairqueue
from benchmarks._common import Run, database, parser, scalar, session, verdict
from benchmarks._systems import Loop
from fairqueue import migrations

TARGET = 100_000


def _loop_copy(conn: psycopg.Connection[Any], specs: list[dict[str, Any]]) -> None:
    with conn.transaction(), conn.cursor().copy("COPY bench_queue (kind, args) FROM STDIN") as copy:
        for s in specs:
            copy.write_row((s["kind"], json.dumps(s["args"])))


METHODS: list[tuple[str, str, Callable[[psycopg.Connection[Any], list[dict[str, Any]]], object]]] = [
    ("fairqueue.enqueue_many", "fairqueue.job", fairqueue.enqueue_many),
    ("fairqueue.bulk_enqueue", "fairqueue.job", fairqueue.bulk_enqueue),
    ("loop: one COPY into its table", "bench_queue", _loop_copy),
]


def one_process(run: Run, jobs: int, channels: int, repeat: int) -> list[dict[str, Any]]:
    specs = [
        {"kind": "bench.job", "channel": f"c{i % channels}", "args": {"n": i, "name": f"row {i}"}} for i in range(jobs)
    ]
    results = []
    for name, table, call in METHODS:
        times = []
        for _ in range(repeat):
            url = run.database("fq_bulk")
            migrations.upgrade(url)
            Loop().setup(url)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CHECKPOINT")
                started = time.perf_counter()
                call(conn, specs)
                times.append(time.perf_counter() - started)
                assert scalar(conn, f"SELECT count(*) FROM {table}") == jobs
        best = min(times)
        results.append({"method": name, "seconds": times, "best_jobs_per_s": round(jobs / best)})
        print(f"{name:30s} {jobs:,} jobs: best of {repeat} {best:.2f} s = {jobs / best:,.0f} jobs/s", flush=True)
    return results


def report(run: Run, args: Any, results: list[dict[str, Any]]) -> None:
    table = ["| method | best jobs/s | runs (s) | target |", "|---|---:|---|---|"]
    for r in results:
        target = ""
        if r["method"] == "fairqueue.bulk_enqueue":
            target = f">= {TARGET:,} jobs/s: {verdict(r['best_jobs_per_s'] >= TARGET)}"
        runs = ", ".join(f"{t:.2f}" for t in r["seconds"])
        table.append(f"| {r['method']} | {r['best_jobs_per_s']:,} | {runs} | {target} |")
    run.finish(
        results,
        f"Bulk enqueue of {args.jobs:,} jobs over {args.channels} channels, best of {args.repeat}",
        table,
        ["One process, one call per method, a fresh database and a CHECKPOINT before each run."],
    )


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
    first = enqueue_dataframe(df, url, **options)
    print(f"enqueue_dataframe {rows:,} rows ({master}): {first.seconds:.1f} s = {first.rows_per_second:,.0f} rows/s")
    again = enqueue_dataframe(df, url, **options)
    print(f"the same call again: {again.seconds:.1f} s ({again.batches_skipped} of {again.batches} batches skipped)")
    session.stop()


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--jobs", type=int, help="default 100,000 (--quick 10,000)")
    p.add_argument("--channels", type=int, default=10)
    p.add_argument("--repeat", type=int, help="runs per method, the best counts (default 3; --quick 1)")
    p.add_argument("--spark", action="store_true", help="enqueue_dataframe instead (needs a TCP database URL)")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args()
    args.jobs = args.jobs or (10_000 if args.quick else 100_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    if args.spark:
        if args.database_url:
            with database(args.database_url) as url:
                migrations.upgrade(url)
                spark(url, args.rows, args.master)
            return
        from fairqueue.embedded import DURABLE_SETTINGS, LocalPostgres, free_tcp_port

        with LocalPostgres(settings=DURABLE_SETTINGS, tcp_port=free_tcp_port()) as server:
            url = server.tcp_url_for("postgres")
            migrations.upgrade(url)
            spark(url, args.rows, args.master)
        return
    with session("bulk_enqueue", args) as run:
        report(run, args, one_process(run, args.jobs, args.channels, args.repeat))


if __name__ == "__main__":
    main()
