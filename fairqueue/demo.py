"""``fairqueue demo``: Bob's 10,000 jobs, then Alice's one; where does Alice's job run?

The workers here are threads, each with its own connection and worker id, claiming batches through
the same calls the worker runtime uses (fairqueue.claim_batch / fairqueue.finish).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

import fairqueue
from fairqueue import migrations
from fairqueue.errors import ConfigurationError
from fairqueue.urls import redact, resolve

BOB, ALICE = "bob", "alice"


@dataclass
class _Run:
    total: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    claimed: int = 0
    by_channel: dict[str, int] = field(default_factory=lambda: {BOB: 0, ALICE: 0})
    waits: dict[str, list[float]] = field(default_factory=lambda: {BOB: [], ALICE: []})
    alice: dict[str, Any] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)


@contextlib.contextmanager
def _database(database_url: str | None) -> Iterator[str]:
    if database_url:
        yield resolve(database_url)
        return
    from fairqueue.embedded import DURABLE_SETTINGS, LocalPostgres

    print("Starting an embedded PostgreSQL (no --database-url given) ...", flush=True)
    with LocalPostgres(settings=DURABLE_SETTINGS) as server:
        with psycopg.connect(server.url) as c:
            version = c.execute("SHOW server_version").fetchone()
        print(f"  PostgreSQL {version[0] if version else '?'} in {server.datadir}", flush=True)
        yield server.url
    print("Embedded PostgreSQL stopped and removed.")


def _worker(url: str, index: int, batch: int, job_ms: float, run: _Run, start: threading.Barrier) -> None:
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            me = fairqueue.register_worker(conn, f"demo-worker-{index}", lease_seconds=60)
            start.wait()
            batch_no = 0
            while True:
                jobs = fairqueue.claim_batch(conn, me, batch)
                if not jobs:
                    with run.lock:
                        if run.claimed >= run.total:
                            break
                    time.sleep(0.005)
                    continue
                batch_no += 1
                with run.lock:
                    for pos, job in enumerate(jobs):
                        run.claimed += 1
                        run.by_channel[job.channel] += 1
                        run.waits[job.channel].append((job.started_at - job.enqueued_at).total_seconds())
                        if job.channel == ALICE:
                            run.alice = {
                                "position": run.claimed,
                                "worker": index,
                                "batch": batch_no,
                                "slot": pos + 1,
                                "batch_size": len(jobs),
                                "wait": (job.started_at - job.enqueued_at).total_seconds(),
                                "bob_left": run.total - 1 - run.by_channel[BOB],
                            }
                if job_ms:
                    time.sleep(job_ms * len(jobs) / 1000)
                fairqueue.finish(conn, me, [fairqueue.Outcome(j.id, result={"ok": True}) for j in jobs])
            fairqueue.deregister_worker(conn, me)
    except BaseException as exc:  # surfaced by the main thread
        run.errors.append(exc)
        with contextlib.suppress(threading.BrokenBarrierError):
            start.abort()


def _percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    ms = sorted(v * 1000 for v in values)
    if len(ms) == 1:
        return f"{ms[0]:.1f} ms"
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return f"p50 {q[49]:.0f} ms, p95 {q[94]:.0f} ms, max {ms[-1]:.0f} ms"


def run_demo(*, database_url: str | None, bob_jobs: int, workers: int, batch: int, job_ms: float) -> int:
    if bob_jobs < 1 or workers < 1 or not 1 <= batch <= 1000 or job_ms < 0:
        raise ConfigurationError("--bob-jobs and --workers must be at least 1, --batch 1..1000, --job-ms >= 0")
    with _database(database_url) as url:
        migrations.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM fairqueue.job").fetchone()
            if row and row[0]:
                raise ConfigurationError(
                    f"the queue in {redact(url)} already holds {row[0]} jobs; the demo claims every job, "
                    "so run it on an empty database (or without --database-url)"
                )
            t0 = time.monotonic()
            with conn.transaction():
                fairqueue.enqueue_many(
                    conn, [fairqueue.JobSpec("demo.resize_image", {"n": i}, channel=BOB) for i in range(bob_jobs)]
                )
            print(f"Bob enqueued {bob_jobs:,} jobs in one transaction ({time.monotonic() - t0:.2f} s).")
            fairqueue.enqueue(conn, "demo.send_invoice", {"customer": "alice"}, channel=ALICE)
            print("Then Alice enqueued 1 job.")
        total = bob_jobs + 1
        run = _Run(total=total)
        start = threading.Barrier(workers + 1)
        threads = [
            threading.Thread(target=_worker, args=(url, i + 1, batch, job_ms, run, start), daemon=True)
            for i in range(workers)
        ]
        for t in threads:
            t.start()
        print(f"{workers} workers draining, {batch} jobs per claim ...")
        with contextlib.suppress(threading.BrokenBarrierError):
            start.wait()
        t0 = time.monotonic()
        while any(t.is_alive() for t in threads):
            with run.lock:
                line = (
                    f"\r  done {run.claimed:>6,}/{total:,}   bob {run.by_channel[BOB]:>6,}   "
                    f"alice {run.by_channel[ALICE]}"
                )
            if sys.stdout.isatty():
                print(line, end="", flush=True)
            time.sleep(0.2)
        elapsed = time.monotonic() - t0
        if sys.stdout.isatty():
            print()
        if run.errors:
            raise run.errors[0]
        a = run.alice
        print(f"Drained {total:,} jobs in {elapsed:.1f} s ({total / elapsed:,.0f} jobs/s).")
        print()
        print(
            f"Alice's job ran as job #{a['position']} of {total:,}: slot {a['slot']} of batch {a['batch']} "
            f"(size {a['batch_size']}) of worker {a['worker']},"
        )
        print(
            f"  {a['wait'] * 1000:.0f} ms after it was enqueued, while {a['bob_left']:,} of Bob's jobs were "
            "still queued."
        )
        print(f"  A first-in-first-out queue would have run it last, after all {bob_jobs:,} of Bob's.")
        print()
        print("Wait from enqueue to start, per channel:")
        print(f"  alice: {_percentiles(run.waits[ALICE])}")
        print(f"  bob:   {_percentiles(run.waits[BOB])}")
    return 0
