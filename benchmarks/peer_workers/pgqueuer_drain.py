"""PgQueuer 1.6 drain, run with .bench-venv's python (see benchmarks/peers.py).

    python pgqueuer_drain.py URL install
    python pgqueuer_drain.py URL enqueue JOBS
    python pgqueuer_drain.py URL backlog JOBS            # Bob's JOBS, then Alice's 1 (payload b"alice")
    python pgqueuer_drain.py URL work MANAGERS BATCH     # prints "ready", waits for a line on stdin, drains

Each queue manager has its own asyncpg connection (as PgQueuer's docs set it up) and runs in drain
mode: it exits once the queue is empty and its jobs are done.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode


async def install(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def enqueue(url: str, jobs: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(conn))
        for start in range(0, jobs, 10_000):
            n = min(10_000, jobs - start)
            await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    finally:
        await conn.close()


async def backlog(url: str, jobs: int) -> None:
    await enqueue(url, jobs)
    conn = await asyncpg.connect(url)
    try:
        await Queries(AsyncpgDriver(conn)).enqueue("noop", b"alice")
    finally:
        await conn.close()


async def _manager(url: str, batch: int, go: asyncio.Event) -> None:
    conn = await asyncpg.connect(url)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        return None

    await go.wait()
    try:
        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1))
    finally:
        await conn.close()


async def work(url: str, managers: int, batch: int) -> None:
    go = asyncio.Event()
    tasks = [asyncio.create_task(_manager(url, batch, go)) for _ in range(managers)]
    await asyncio.sleep(0.5)  # connections open
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    go.set()
    await asyncio.gather(*tasks)


def main() -> None:
    url, action, *rest = sys.argv[1:]
    if action == "install":
        asyncio.run(install(url))
    elif action == "enqueue":
        asyncio.run(enqueue(url, int(rest[0])))
    elif action == "backlog":
        asyncio.run(backlog(url, int(rest[0])))
    elif action == "work":
        asyncio.run(work(url, int(rest[0]), int(rest[1])))
    else:
        raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    main()
