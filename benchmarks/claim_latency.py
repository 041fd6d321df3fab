"""Claim latency versus backlog: does claiming a batch cost the same at 1,000 and 1,000,000 queued jobs?

    python -m benchmarks.claim_latency                 # embedded PostgreSQL, durable settings
    python -m benchmarks.claim_latency --database-url postgresql://...   # an existing (scratch!) database
    python -m benchmarks.claim_latency --explain docs/claim-plan.txt     # also save the claim's plans

For each scenario the queue is filled server-side, then the loop is steady state: enqueue 10 jobs
into random channels, time one claim of --batch jobs (one round trip, client-side wall clock),
finish them. Results go to benchmarks/results/*.json and a table is printed (markdown).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

import fairqueue
from benchmarks._common import database
from fairqueue import migrations

SCENARIOS = [(1_000, 10), (1_000, 10_000), (1_000_000, 10), (1_000_000, 10_000)]
RESULTS = Path(__file__).parent / "results"


def reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "TRUNCATE fairqueue.job, fairqueue.running_job, fairqueue.scheduled_job, fairqueue.job_dependency, "
        "fairqueue.fifo_holder, fairqueue.fifo_waiting, fairqueue.channel_wakeup, fairqueue.worker, "
        "fairqueue.channel, fairqueue.completed_job RESTART IDENTITY"
    )


def fill(conn: psycopg.Connection[Any], jobs: int, channels: int) -> None:
    """Enqueues ``jobs`` jobs spread evenly over ``channels`` channels, in 100k-job statements."""
    conn.execute(
        "INSERT INTO fairqueue.channel (name) SELECT 'tenant' || g FROM generate_series(0, %s - 1) g", (channels,)
    )
    done = 0
    while done < jobs:
        n = min(100_000, jobs - done)
        conn.execute(
            "SELECT count(*) FROM fairqueue.enqueue_many("
            "  ARRAY(SELECT 'bench.noop' FROM generate_series(1, %(n)s)), NULL,"
            "  ARRAY(SELECT 'tenant' || ((g + %(off)s) %% %(c)s) FROM generate_series(1, %(n)s) g))",
            {"n": n, "off": done, "c": channels},
        )
        done += n
    conn.execute("VACUUM ANALYZE fairqueue.job")
    conn.execute("VACUUM ANALYZE fairqueue.running_job")
    conn.execute("VACUUM ANALYZE fairqueue.channel")


def run_scenario(conn: psycopg.Connection[Any], jobs: int, channels: int, batch: int, rounds: int) -> dict[str, Any]:
    reset(conn)
    t0 = time.monotonic()
    fill(conn, jobs, channels)
    fill_s = time.monotonic() - t0
    worker = fairqueue.register_worker(conn, "bench", lease_seconds=3600)
    rng = random.Random(7)
    timings: list[float] = []
    for i in range(rounds + 50):
        fairqueue.enqueue_many(
            conn, [fairqueue.JobSpec("bench.noop", channel=f"tenant{rng.randrange(channels)}") for _ in range(10)]
        )
        t = time.perf_counter()
        claimed = fairqueue.claim_batch(conn, worker, batch)
        elapsed = time.perf_counter() - t
        fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in claimed])
        if i == 49:
            # The first claims activate every channel (one-off wake-up processing). Vacuum once, as
            # autovacuum would in the steady state, so the fill's dead tuples do not skew the numbers.
            for table in ("channel_wakeup", "channel", "running_job", "job"):
                conn.execute(f"VACUUM fairqueue.{table}")
        if i >= 50:
            timings.append(elapsed * 1000)
        assert len(claimed) == batch, f"expected a full batch, got {len(claimed)}"
    timings.sort()
    q = statistics.quantiles(timings, n=100, method="inclusive")
    return {
        "queued": jobs,
        "channels": channels,
        "batch": batch,
        "rounds": rounds,
        "fill_seconds": round(fill_s, 1),
        "claim_ms_p50": round(q[49], 3),
        "claim_ms_p95": round(q[94], 3),
        "claim_ms_mean": round(statistics.fmean(timings), 3),
    }


def explain_claim(conn: psycopg.Connection[Any], batch: int) -> str:
    """EXPLAIN ANALYZE of every statement the claim function runs, via auto_explain at NOTICE level."""
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    worker = fairqueue.register_worker(conn, "explain", lease_seconds=3600)
    fairqueue.claim_batch(conn, worker, batch)  # warm
    conn.execute("LOAD 'auto_explain'")
    for setting, value in [
        ("auto_explain.log_min_duration", "0"),
        ("auto_explain.log_analyze", "on"),
        ("auto_explain.log_buffers", "on"),
        ("auto_explain.log_timing", "on"),
        ("auto_explain.log_nested_statements", "on"),
        ("auto_explain.log_level", "notice"),
        ("client_min_messages", "notice"),
    ]:
        conn.execute(f"SET {setting} = '{value}'")
    fairqueue.claim_batch(conn, worker, batch)
    conn.execute("SET auto_explain.log_min_duration = -1")
    return "\n\n".join(notices)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", help="scratch database (it is emptied!); default: embedded server")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--explain", type=Path, help="write the claim's EXPLAIN ANALYZE (1M jobs, 10k channels) here")
    parser.add_argument(
        "--scenario",
        action="append",
        metavar="JOBSxCHANNELS",
        help="run only these, e.g. --scenario 1000000x10000 (default: all four)",
    )
    args = parser.parse_args()

    results = []
    with database(args.database_url) as url:
        migrations.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            settings: dict[str, str] = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN "
                    "('fsync', 'synchronous_commit', 'shared_buffers', 'full_page_writes')"
                ).fetchall()
            )
            chosen = [tuple(int(x) for x in sc.split("x")) for sc in args.scenario] if args.scenario else SCENARIOS
            for jobs, channels in chosen:
                r = run_scenario(conn, jobs, channels, args.batch, args.rounds)
                results.append(r)
                print(
                    f"queued {jobs:>9,} channels {channels:>6,}: claim of {args.batch} "
                    f"p50 {r['claim_ms_p50']:.3f} ms  p95 {r['claim_ms_p95']:.3f} ms  (fill {r['fill_seconds']} s)",
                    flush=True,
                )
                if args.explain and (jobs, channels) == (1_000_000, 10_000):
                    args.explain.write_text(explain_claim(conn, args.batch) + "\n")
    record: dict[str, Any] = {
        "benchmark": "claim_latency",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpu_count": __import__("os").cpu_count(),
            "platform": platform.platform(),
        },
        "postgres": {"version": version[0] if version else None, **settings},
        "results": results,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"claim_latency-{record['when'].replace(':', '')}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print()
    print(f"| queued | channels | claim of {args.batch}: p50 ms | p95 ms |")
    print("|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['queued']:,} | {r['channels']:,} | {r['claim_ms_p50']:.3f} | {r['claim_ms_p95']:.3f} |")
    by_shape = {(r["queued"], r["channels"]): r for r in results}
    if (1_000, 10_000) in by_shape and (1_000_000, 10_000) in by_shape:
        ratio = by_shape[1_000_000, 10_000]["claim_ms_p50"] / by_shape[1_000, 10_000]["claim_ms_p50"]
        print(f"\n1M vs 1k queued (10k channels): p50 ratio {ratio:.2f}x")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
