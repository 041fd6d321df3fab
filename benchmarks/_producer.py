"""A producer process for fairqueue or the hand-written loop: one job per transaction on a paced
schedule (see benchmarks/peer_workers/pace.py); prints its result as one JSON line.

    python -m benchmarks._producer URL fairqueue|loop RATE SECONDS START_AT [CHANNELS]

START_AT is a wall-clock time (time.time()), so that several producers start together.
"""

from __future__ import annotations

import sys

import psycopg

from benchmarks.peer_workers import pace
from benchmarks.tasks import noop


def main() -> None:
    url, system, rate, seconds, start_at, *rest = sys.argv[1:]
    channels = [noop.using(channel=f"c{i}") for i in range(int(rest[0]) if rest else 1)]
    with psycopg.connect(url, autocommit=True) as conn:
        if system == "fairqueue":
            result = pace.paced(
                lambda i: channels[i % len(channels)].enqueue(conn), float(rate), float(seconds), float(start_at)
            )
        elif system == "loop":
            result = pace.paced(
                lambda i: conn.execute("INSERT INTO bench_queue (kind) VALUES ('noop')"),
                float(rate),
                float(seconds),
                float(start_at),
            )
        else:
            raise SystemExit(f"unknown system {system!r}")
    pace.report(result)


if __name__ == "__main__":
    main()
