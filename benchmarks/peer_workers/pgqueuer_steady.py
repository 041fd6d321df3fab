"""PgQueuer 1.6 workers and producers for the steady, fairness and enqueue-latency workloads, run with
.bench-venv's python (see benchmarks/_systems.py, class PgQueuer).

    python pgqueuer_steady.py URL install
    python pgqueuer_steady.py URL serve BATCH                   # prints "ready"; runs until stdin closes
    python pgqueuer_steady.py URL produce RATE SECONDS START_AT [COUNT]  # one job per transaction, paced
    python pgqueuer_steady.py URL add CHANNEL JOBS              # JOBS jobs with payload CHANNEL
    python pgqueuer_steady.py URL backlogged JSON               # keeps channels backlogged (pace.py)
    python pgqueuer_steady.py URL enqueue-latency SAMPLES GAP   # enqueue inside a transaction, timed

``serve`` is one queue manager on its own asyncpg connection in PgQueuer's continuous mode: it
LISTENs for the notification its insert trigger sends and dequeues up to BATCH jobs per round trip.
A job's payload is its channel name (b"bob", b"alice", ...), so backlogs can be counted per channel.
Results are printed as one JSON line (pace.report).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import timedelta
from typing import Any

import asyncpg
import pace
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer_drain import install


async def serve(url: str, batch: int) -> None:
    conn = await asyncpg.connect(url)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        return None

    running = asyncio.create_task(qm.run(batch_size=batch, dequeue_timeout=timedelta(seconds=30)))
    await asyncio.sleep(1.0)  # structure verified, listener up
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    qm.shutdown.set()
    await running


class Producer:
    """A synchronous face over one asyncpg connection (pace.py's schedules are synchronous)."""

    def __init__(self, url: str) -> None:
        self.runner = asyncio.Runner()
        self.conn = self.runner.run(asyncpg.connect(url))
        self.queries = Queries(AsyncpgDriver(self.conn))

    def enqueue(self, payload: bytes, n: int = 1) -> int:
        if n == 1:
            ids = self.runner.run(self.queries.enqueue("noop", payload))
        else:
            ids = self.runner.run(self.queries.enqueue(["noop"] * n, [payload] * n, [0] * n))
        return int(ids[0])

    def rows(self, query: str) -> list[Any]:
        return list(self.runner.run(self.conn.fetch(query)))

    def close(self) -> None:
        self.runner.run(self.conn.close())
        self.runner.close()


def produce(url: str, rate: float, seconds: float, start_at: float, count: int) -> None:
    p = Producer(url)
    try:
        pace.report(pace.paced(lambda i: p.enqueue(b"noop"), rate, seconds, start_at, count))
    finally:
        p.close()


def backlogged(url: str, options: dict[str, Any]) -> None:
    p = Producer(url)
    counts = "SELECT encode(payload, 'escape') AS c, count(*) AS n FROM pgqueuer WHERE status = 'queued' GROUP BY 1"
    try:
        alice = options.pop("alice", False)
        result = pace.keep_backlogged(
            lambda: {r["c"]: r["n"] for r in p.rows(counts)},
            lambda channel, n: p.enqueue(channel.encode(), n),
            options.pop("channels"),
            trickle=(lambda: p.enqueue(b"alice")) if alice else None,
            **options,
        )
        pace.report(result)
    finally:
        p.close()


async def enqueue_latency(url: str, samples: int, gap: float) -> None:
    """Times ``Queries.enqueue`` inside an open transaction, and the call plus its commit (ms)."""
    conn = await asyncpg.connect(url)
    queries = Queries(AsyncpgDriver(conn))
    call, call_commit = [], []
    try:
        for _ in range(samples):
            tx = conn.transaction()
            await tx.start()
            t0 = time.perf_counter()
            await queries.enqueue("noop", b"noop")
            t1 = time.perf_counter()
            await tx.commit()
            t2 = time.perf_counter()
            call.append((t1 - t0) * 1000)
            call_commit.append((t2 - t0) * 1000)
            await asyncio.sleep(gap)
    finally:
        await conn.close()
    pace.report({"call_ms": call, "call_commit_ms": call_commit})


def main() -> None:
    url, action, *rest = sys.argv[1:]
    if action == "install":
        asyncio.run(install(url))
    elif action == "serve":
        asyncio.run(serve(url, int(rest[0])))
    elif action == "produce":
        produce(url, float(rest[0]), float(rest[1]), float(rest[2]), int(rest[3]) if len(rest) > 3 else 0)
    elif action == "add":
        p = Producer(url)
        p.enqueue(rest[0].encode(), int(rest[1]))
        p.close()
    elif action == "backlogged":
        backlogged(url, json.loads(rest[0]))
    elif action == "enqueue-latency":
        asyncio.run(enqueue_latency(url, int(rest[0]), float(rest[1])))
    else:
        raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    main()
