"""A producer process for fairqueue or the hand-written loop: one job per transaction on a paced
schedule (see benchmarks/peer_workers/pace.py); prints its result as one JSON line.

    python -m benchmarks._producer URL fairqueue|loop|floor RATE SECONDS START_AT [COUNT]

START_AT is a wall-clock time (time.time()), so that several producers start together; with COUNT,
it stops after COUNT jobs (or SECONDS, whichever comes first). With FAIRQUEUE_BENCH_CHANNELS=N in the
environment, job i goes to channel c<i mod N> (default: every job to c0).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import psycopg

from benchmarks import floor
from benchmarks.peer_workers import pace
from benchmarks.tasks import noop


def main() -> None:
    url, system, rate, seconds, start_at, *rest = sys.argv[1:]
    channels = [f"c{n}" for n in range(int(os.environ.get("FAIRQUEUE_BENCH_CHANNELS") or 1))]
    tasks = [noop.using(channel=c) for c in channels]
    with psycopg.connect(url, autocommit=True) as conn:
        if system == "fairqueue":
            send: Callable[[int], object] = lambda i: tasks[i % len(tasks)].enqueue(conn)  # noqa: E731
        elif system == "loop":
            send = lambda i: conn.execute(  # noqa: E731
                "INSERT INTO bench_queue (kind) VALUES (%s)", (channels[i % len(channels)],)
            )
        elif system == "floor":
            send = lambda i: conn.execute(floor.ENQUEUE_ONE, (channels[i % len(channels)],))  # noqa: E731
        else:
            raise SystemExit(f"unknown system {system!r}")
        pace.report(pace.paced(send, float(rate), float(seconds), float(start_at), int(rest[0]) if rest else 0))


if __name__ == "__main__":
    main()
