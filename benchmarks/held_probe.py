"""Why a held snapshot slows fairqueue's producers: one look at what a producer reads, before and
during a held REPEATABLE READ snapshot, under steady load (issue 16's "measure first").

    python -m benchmarks.held_probe [--rate 1000] [--channels 100] [--hold 25] [--database-url URL]

fairqueue workers (2 processes, concurrency and batch 50) and 4 producer processes at --rate jobs/s
over --channels channels run for 12 s; then, before and after --hold seconds of a held snapshot:
single enqueues into one channel from a side connection (p50/p95 ms, commit included); the buffers
of the producer's channel lookup (_wake_channel's `SELECT ... FROM fairqueue.channel_active WHERE
name = ... AND active`, and the same look-up in the channel row, which producers read before schema
revision fq0011); the channel table's size and updates (HOT or not); and where one claim of 50 reads
its buffers, relation by relation (a claim in a transaction that is rolled back, so no job is taken;
PostgreSQL's per-transaction counters); and, sampled during the hold, what the producers' statements
wait for. Prints only; it is a diagnostic, not a workload with targets.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import time
from typing import Any

import psycopg

import fairqueue
from benchmarks._common import database, fresh_database
from benchmarks._systems import Fairqueue
from benchmarks.tasks import noop

LOOKUPS = {
    "producer lookup (channel_active)": "SELECT 1 FROM fairqueue.channel_active WHERE name = 'c7' AND active",
    "same in the channel row": "SELECT 1 FROM fairqueue.channel WHERE name = 'c7' AND active",
}
CLAIM_RELATIONS = (
    "channel",
    "channel_pkey",
    "channel_eligible_idx",
    "running_job",
    "running_job_pkey",
    "running_job_ready_idx",
    "job",
    "job_pkey",
    "channel_wakeup",
    "channel_wakeup_pkey",
)
CLAIM_READS = "SELECT r, pg_stat_get_xact_blocks_fetched(('fairqueue.' || r)::regclass) FROM unnest(%s::text[]) AS r"
CHANNEL = (
    "SELECT pg_total_relation_size('fairqueue.channel'), n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
    "WHERE relid = 'fairqueue.channel'::regclass"
)


def enqueue_ms(url: str, n: int = 200) -> tuple[float, float]:
    times = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(n):
            t = time.perf_counter()
            noop.using(channel="c7").enqueue(conn)
            times.append((time.perf_counter() - t) * 1000)
            time.sleep(0.005)
    q = statistics.quantiles(times, n=100, method="inclusive")
    return round(q[49], 2), round(q[94], 2)


WAITS = (
    "SELECT coalesce(wait_event_type || ':' || wait_event, 'on CPU'), count(*) FROM pg_stat_activity "
    "WHERE state = 'active' AND query LIKE '%%enqueue%%' AND pid <> pg_backend_pid() GROUP BY 1"
)


def producer_waits(conn: psycopg.Connection[Any], seconds: float) -> str:
    """Samples, every 20 ms for ``seconds``, what the producers' statements are doing (waiting for a
    lock, for I/O, for the WAL, or running), and returns the shares."""
    counts: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for what, n in conn.execute(WAITS).fetchall():
            counts[what] = counts.get(what, 0) + n
        time.sleep(0.02)
    total = sum(counts.values()) or 1
    return ", ".join(f"{what} {n / total:.0%}" for what, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def claim_reads(url: str, worker: int) -> str:
    """Buffers one claim of 50 reads, by relation (its transaction is rolled back: nothing is taken)."""
    with psycopg.connect(url) as conn:
        before: dict[str, int] = dict(conn.execute(CLAIM_READS, (list(CLAIM_RELATIONS),)).fetchall())
        t = time.perf_counter()
        got = len(fairqueue.claim_batch(conn, worker, 50))
        ms = (time.perf_counter() - t) * 1000
        after: dict[str, int] = dict(conn.execute(CLAIM_READS, (list(CLAIM_RELATIONS),)).fetchall())
        conn.rollback()
    reads = ", ".join(f"{r} {after[r] - before[r]:,}" for r in CLAIM_RELATIONS if after[r] - before[r])
    return f"claim of 50 ({got} jobs, {ms:.1f} ms) read {reads}"


def look(conn: psycopg.Connection[Any], url: str, when: str, worker: int) -> None:
    p50, p95 = enqueue_ms(url)
    lookups = []
    for name, query in LOOKUPS.items():
        plan = [r[0].strip() for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + query).fetchall()]
        lookups.append(f"{name} {next((line for line in plan if line.startswith('Buffers')), 'no buffers')}")
    size, updates, hot = conn.execute(CHANNEL).fetchone() or (0, 0, 0)
    print(
        f"{when}: enqueue p50 {p50} ms, p95 {p95} ms; {'; '.join(lookups)}; channel table "
        f"{size / 1024:,.0f} KiB, {updates:,} updates ({hot:,} HOT); {claim_reads(url, worker)}",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url")
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--channels", type=int, default=100)
    p.add_argument("--hold", type=float, default=25.0)
    args = p.parse_args()
    with database(args.database_url) as server:
        url = fresh_database(server, "fq_held_probe")
        os.environ["FAIRQUEUE_BENCH_CHANNELS"] = str(args.channels)  # read by benchmarks/_producer.py
        system = Fairqueue(2, 50, 50)
        system.setup(url)
        workers = system.start(url)
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool, psycopg.connect(url, autocommit=True) as conn:
                seconds = 12 + args.hold + 15
                producing = pool.submit(system.produce, url, args.rate, seconds, time.time() + 1, 4)
                time.sleep(12)
                worker = fairqueue.register_worker(conn, "held-probe", lease_seconds=3600)
                look(conn, url, "before the hold", worker)
                with psycopg.connect(url) as holder:
                    holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                    holder.execute("SELECT count(*) FROM pg_class").fetchone()
                    print(f"producers' waits during the hold: {producer_waits(conn, args.hold)}", flush=True)
                    look(conn, url, f"after {args.hold:g} s of the hold", worker)
                    holder.rollback()
                producing.result()
        finally:
            workers.stop()


if __name__ == "__main__":
    main()
