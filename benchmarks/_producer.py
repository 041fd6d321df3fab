"""A producer process for fairqueue or the hand-written loop: one job per transaction on a paced
schedule (see benchmarks/peer_workers/pace.py); prints its result as one JSON line.

    python -m benchmarks._producer URL fairqueue|loop RATE SECONDS START_AT [COUNT]

START_AT is a wall-clock time (time.time()), so that several producers start together; with COUNT,
it stops after COUNT jobs (or SECONDS, whichever comes first).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import psycopg

from benchmarks.peer_workers import pace
from benchmarks.tasks import noop


def main() -> None:
    url, system, rate, seconds, start_at, *rest = sys.argv[1:]
    task = noop.using(channel="c0")
    with psycopg.connect(url, autocommit=True) as conn:
        if system == "fairqueue":
            send: Callable[[int], object] = lambda i: task.enqueue(conn)  # noqa: E731
        elif system == "loop":
            send = lambda i: conn.execute("INSERT INTO bench_queue (kind) VALUES ('noop')")  # noqa: E731
        else:
            raise SystemExit(f"unknown system {system!r}")
        pace.report(pace.paced(send, float(rate), float(seconds), float(start_at), int(rest[0]) if rest else 0))


if __name__ == "__main__":
    main()
