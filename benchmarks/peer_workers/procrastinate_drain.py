"""Procrastinate 3.10 drain, run with .bench-venv's python (see benchmarks/peers.py).

    python procrastinate_drain.py URL install
    python procrastinate_drain.py URL enqueue JOBS
    python procrastinate_drain.py URL backlog JOBS        # Bob's JOBS, then Alice's 1 (args who="alice")
    python procrastinate_drain.py URL work CONCURRENCY   # prints "ready", waits for a line on stdin, drains

The worker is Procrastinate's own (``run_worker_async``) with ``wait=False``: it exits once no job
is left to fetch.
"""

from __future__ import annotations

import asyncio
import sys

from procrastinate import App, PsycopgConnector

app = App(connector=PsycopgConnector(conninfo=sys.argv[1] if len(sys.argv) > 1 else ""))


@app.task(name="noop")
async def noop(who: str = "bob") -> None:
    return None


async def install() -> None:
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def enqueue(jobs: int) -> None:
    async with app.open_async():
        for start in range(0, jobs, 5_000):
            await noop.batch_defer_async(*({} for _ in range(min(5_000, jobs - start))))


async def backlog(jobs: int) -> None:
    await enqueue(jobs)
    async with app.open_async():
        await noop.defer_async(who="alice")


async def work(concurrency: int) -> None:
    async with app.open_async():
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await app.run_worker_async(concurrency=concurrency, wait=False, install_signal_handlers=False)


def main() -> None:
    _, action, *rest = sys.argv[1:]
    if action == "install":
        asyncio.run(install())
    elif action == "enqueue":
        asyncio.run(enqueue(int(rest[0])))
    elif action == "backlog":
        asyncio.run(backlog(int(rest[0])))
    elif action == "work":
        asyncio.run(work(int(rest[0])))
    else:
        raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    main()
