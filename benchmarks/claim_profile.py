"""Where a claim's and a finish's time goes, statement by statement (auto_explain of the nested
statements), at a given channel count: issue 16's "measure first" for the claim.

    python -m benchmarks.claim_profile [--channels 1000] [--jobs 20000] [--batch 100] [--database-url URL]

Queues --jobs no-op jobs over --channels channels, registers a worker, warms up with five
claim/finish cycles, then runs one claim of --batch and its finish with auto_explain logging every
nested statement to this session (ANALYZE, BUFFERS), and prints the statements by duration with
their buffers; then the median of 20 claims without auto_explain. Prints only (a diagnostic).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import psycopg

import fairqueue
from benchmarks._common import database, fresh_database
from fairqueue import migrations

AUTO_EXPLAIN = [
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_buffers = on",
    "SET client_min_messages = log",
]
LOGGED = re.compile(r"duration: ([\d.]+) ms\s+plan:\s+Query Text: (.*?)\n(.*)", re.S)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url")
    p.add_argument("--channels", type=int, default=1000)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=100)
    args = p.parse_args()
    with database(args.database_url) as server:
        url = fresh_database(server, "fq_claim_profile")
        migrations.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            jobs = [fairqueue.JobSpec("noop", channel=f"c{i % args.channels}") for i in range(args.jobs)]
            fairqueue.enqueue_many(conn, jobs)
            conn.execute("VACUUM ANALYZE")
            me = fairqueue.register_worker(conn, lease_seconds=600)

            def cycle() -> tuple[float, float]:
                t0 = time.perf_counter()
                claimed = fairqueue.claim_batch(conn, me, args.batch)
                t1 = time.perf_counter()
                fairqueue.finish(conn, me, [fairqueue.Outcome(j.id) for j in claimed])
                return (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000

            for _ in range(5):
                cycle()
            logged: list[str] = []
            conn.add_notice_handler(lambda d: logged.append(d.message_primary or ""))
            for statement in AUTO_EXPLAIN:
                conn.execute(statement)
            claim_ms, finish_ms = cycle()
            conn.execute("SET auto_explain.log_min_duration = -1")
            print(
                f"one claim of {args.batch} over {args.channels:,} channels: {claim_ms:.2f} ms, its finish "
                f"{finish_ms:.2f} ms (auto_explain on)"
            )
            rows = []
            for message in logged:
                m = LOGGED.search(message)
                if m:
                    buffers = re.search(r"Buffers: ([^\n]*)", m[3])
                    rows.append((float(m[1]), " ".join(m[2].split())[:90], buffers[1] if buffers else ""))
            for ms, text, reads in sorted(rows, reverse=True):
                print(f"{ms:8.3f} ms  {reads:<40}  {text}")
            claims = [cycle()[0] for _ in range(20)]
            print(f"median claim of {args.batch} without auto_explain: {statistics.median(claims):.2f} ms")


if __name__ == "__main__":
    main()
