"""Drain throughput of the core claim/finish API against a hand-written SKIP LOCKED loop and the fair
SQL floor (benchmarks/floor.py).

    python -m benchmarks.drain --jobs 20000 --processes 2 --batch 10 --channels 1 --channels 10

Each process loops: claim a batch, finish it (no-op jobs), one round trip each, autocommit. The
reference loop does the same on a plain one-table queue (UPDATE ... SKIP LOCKED / DELETE) in the
same database, and for each channel count the floor drains the same jobs just before fairqueue.
This measures the queue operations alone; the worker runtime adds its own costs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from typing import Any

import psycopg

import fairqueue
from benchmarks import floor
from benchmarks._common import database
from fairqueue import migrations
from fairqueue.roles import READABLE_TABLES


def _fairqueue_worker(url: str, batch: int, start: Any, done: Any) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        me = fairqueue.register_worker(conn, lease_seconds=600)
        start.wait()
        empty = 0
        n = 0
        while empty < 3:
            jobs = fairqueue.claim_batch(conn, me, batch)
            if not jobs:
                empty += 1
                continue
            empty = 0
            fairqueue.finish(conn, me, [fairqueue.Outcome(j.id) for j in jobs])
            n += len(jobs)
        done.put(n)


def _reference_worker(url: str, batch: int, start: Any, done: Any) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        start.wait()
        n = 0
        while True:
            rows = conn.execute(
                "UPDATE bench_queue SET status = 'running' WHERE id IN (SELECT id FROM bench_queue "
                "WHERE status = 'ready' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, kind, args",
                (batch,),
            ).fetchall()
            if not rows:
                break
            conn.execute("DELETE FROM bench_queue WHERE id = ANY(%s)", ([r[0] for r in rows],))
            n += len(rows)
        done.put(n)


def _floor_worker(url: str, batch: int, start: Any, done: Any) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        start.wait()
        empty = 0
        n = 0
        while empty < 3:
            rows = conn.execute(floor.CLAIM, (batch,)).fetchall()
            if not rows:
                empty += 1
                continue
            empty = 0
            conn.execute(floor.FINISH, ([r[0] for r in rows],))
            n += len(rows)
        done.put(n)


def run(url: str, target: Any, processes: int) -> tuple[int, float]:
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(processes + 1)
    done = ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, BATCH, start, done)) for _ in range(processes)]
    for p in procs:
        p.start()
    start.wait()
    t0 = time.monotonic()
    total = sum(done.get() for _ in procs)
    elapsed = time.monotonic() - t0
    for p in procs:
        p.join()
    return total, elapsed


BATCH = 10


def main() -> None:
    global BATCH
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--channels", type=int, action="append")
    args = parser.parse_args()
    BATCH = args.batch
    with database(args.database_url) as url:
        migrations.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS bench_queue (id bigserial PRIMARY KEY, kind text, "
                "args jsonb NOT NULL DEFAULT '{}', status text NOT NULL DEFAULT 'ready')"
            )
            conn.execute("CREATE INDEX IF NOT EXISTS bench_queue_ready ON bench_queue (id) WHERE status = 'ready'")
            conn.execute("TRUNCATE bench_queue")
            conn.execute("INSERT INTO bench_queue (kind) SELECT 'noop' FROM generate_series(1, %s)", (args.jobs,))
            conn.execute("VACUUM ANALYZE bench_queue")
            total, elapsed = run(url, _reference_worker, args.processes)
            print(f"hand-written SKIP LOCKED loop: {total} jobs in {elapsed:.2f} s = {total / elapsed:,.0f} jobs/s")
            conn.execute(floor.TABLES)
            for channels in args.channels or [1, 10]:
                conn.execute("TRUNCATE floor_job, floor_wakeup, floor_channel, floor_running, floor_done")
                for c in range(channels):
                    share = args.jobs // channels + (c < args.jobs % channels)
                    if share:
                        conn.execute(floor.ENQUEUE, (f"c{c}", share))
                conn.execute("VACUUM ANALYZE floor_job")
                total, elapsed = run(url, _floor_worker, args.processes)
                print(
                    f"fair SQL floor, {channels} channel(s): {total} jobs in {elapsed:.2f} s = "
                    f"{total / elapsed:,.0f} jobs/s"
                )
                # every table of the queue, as the tests start (a list by hand missed the tables added
                # since, and TRUNCATE refuses a table that another one not in the list references)
                conn.execute("TRUNCATE " + ", ".join(f"fairqueue.{t}" for t in READABLE_TABLES) + " RESTART IDENTITY")
                fairqueue.enqueue_many(
                    conn, [fairqueue.JobSpec("noop", channel=f"c{i % channels}") for i in range(args.jobs)]
                )
                conn.execute("VACUUM ANALYZE fairqueue.running_job")
                total, elapsed = run(url, _fairqueue_worker, args.processes)
                print(
                    f"fairqueue, {channels} channel(s): {total} jobs in {elapsed:.2f} s = {total / elapsed:,.0f} jobs/s"
                )


if __name__ == "__main__":
    main()
