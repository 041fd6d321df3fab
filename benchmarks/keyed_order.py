"""What a keyed claim costs against the unkeyed one at scale: issue 17's "claim cost flat" target, for
both ways a channel's keys take turns.

    python -m benchmarks.keyed_order                      # 1,000,000 jobs, 10,000 channels x 100 keys
    python -m benchmarks.keyed_order --quick --no-doc     # smoke run

Three databases on one server, each filled as ``benchmarks.claim_latency --scenario JOBSxCHANNELS``
fills its queue: without fair keys; with --keys keys per channel, whose keys take turns by the slots
their jobs carry (a channel without a cap per key, schema fq0025: the claim takes a channel's share
from one index range, no row per key); and the same keyed queue in channels that cap their keys at a
cap no key reaches, whose keys take turns by their rows in channel_key (a row per key in turn, which
a claim reads, charges, and deletes when the key runs dry: how every keyed channel took turns until
fq0025). All three run claim_latency's steady loop (enqueue 10 jobs into random channels and keys,
time one claim of 10, finish them) in blocks of 100 rounds, taking turns block by block (the first 5
claims of a block are not timed), after 50 warm-up rounds and a VACUUM. Prints each claim's p50 and
p95 and its p50 against the unkeyed claim's.

Until fq0025 this command measured a prototype of the slots against the rows (docs/benchmarks.md,
"A key order carried by the jobs"); the slots are now the schema's.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import psycopg

import fairqueue
from benchmarks._common import parser, session
from benchmarks.claim_latency import fill
from fairqueue import migrations

BLOCK = 100
WARM_UP = 50
# A cap per key that no key of the benchmark reaches: the channel's keys take turns by rows.
ROWS_CAP = 1000

SYSTEMS = ("no keys", "keys (slots)", "keys (rows: a cap per key)")


def _round(conn: psycopg.Connection[Any], worker: int, rng: random.Random, channels: int, keys: int) -> float:
    fairqueue.enqueue_many(
        conn,
        [
            fairqueue.JobSpec(
                "bench.noop",
                channel=f"tenant{rng.randrange(channels)}",
                fair_key=f"user{rng.randrange(keys)}" if keys else None,
            )
            for _ in range(10)
        ],
    )
    t = time.perf_counter()
    claimed = fairqueue.claim_batch(conn, worker, 10)
    elapsed = time.perf_counter() - t
    fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in claimed])
    if len(claimed) != 10:
        raise SystemExit(f"a claim came back with {len(claimed)} jobs, not 10: use more --jobs")
    return elapsed * 1000


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--jobs", type=int, default=1_000_000, help="jobs queued (default 1,000,000)")
    p.add_argument("--channels", type=int, default=10_000, help="channels (default 10,000)")
    p.add_argument("--keys", type=int, default=100, help="fair keys per channel (default 100)")
    p.add_argument("--rounds", type=int, default=1_000, help="timed rounds per system, a multiple of 100")
    args = p.parse_args(argv)
    if args.quick:
        args.jobs, args.channels, args.keys, args.rounds = 20_000, 100, 10, 200
    if args.rounds % BLOCK or args.rounds <= 0:
        raise SystemExit(f"--rounds must be a positive multiple of {BLOCK}")

    with session("keyed_order", args) as run:
        conns: dict[str, psycopg.Connection[Any]] = {}
        try:
            for n, name in enumerate(SYSTEMS):
                url = run.database(f"fairqueue_keyed_order_{n}")
                migrations.upgrade(url)
                conn = conns[name] = psycopg.connect(url, autocommit=True)
                fill(conn, args.jobs, args.channels, keys=args.keys if n else 0)
                if name == "keys (rows: a cap per key)":
                    for c in range(args.channels):
                        fairqueue.configure_channel(conn, f"tenant{c}", key_max_concurrency=ROWS_CAP)
                    conn.execute("SELECT fairqueue.promote_due_jobs()")
                    conn.execute("VACUUM ANALYZE fairqueue.channel_key")
            state = {
                name: (fairqueue.register_worker(conns[name], "bench", lease_seconds=3600), random.Random(7))
                for name in SYSTEMS
            }
            for name in SYSTEMS:  # warm-up, then what autovacuum does in the steady state
                worker, rng = state[name]
                for _ in range(WARM_UP):
                    _round(conns[name], worker, rng, args.channels, args.keys if name != "no keys" else 0)
                for relation in ("channel_wakeup", "channel", "channel_key", "running_job", "job"):
                    conns[name].execute(f"VACUUM fairqueue.{relation}")
            timings: dict[str, list[float]] = {name: [] for name in SYSTEMS}
            for block in range(args.rounds // BLOCK):
                for k in range(len(SYSTEMS)):
                    name = SYSTEMS[(block + k) % len(SYSTEMS)]
                    worker, rng = state[name]
                    keys = args.keys if name != "no keys" else 0
                    for i in range(BLOCK):
                        ms = _round(conns[name], worker, rng, args.channels, keys)
                        if i >= 5:
                            timings[name].append(ms)
        finally:
            for conn in conns.values():
                conn.close()
        q = {name: statistics.quantiles(v, n=100, method="inclusive") for name, v in timings.items()}
        base = q["no keys"][49]
        results = {
            "jobs": args.jobs,
            "channels": args.channels,
            "keys": args.keys,
            "claims_per_system": len(timings["no keys"]),
            "claim_ms_p50": {name: round(v[49], 3) for name, v in q.items()},
            "claim_ms_p95": {name: round(v[94], 3) for name, v in q.items()},
            "p50_against_no_keys": {name: round(v[49] / base, 2) for name, v in q.items()},
        }
        table = [
            f"| claim of 10 ({args.jobs:,} queued, {args.channels:,} channels x {args.keys} keys) "
            "| p50 ms | p95 ms | p50 / no keys |",
            "|---|---:|---:|---:|",
            *(f"| {name} | {q[name][49]:.3f} | {q[name][94]:.3f} | {q[name][49] / base:.2f}x |" for name in SYSTEMS),
        ]
        run.finish(results, "The keyed claim by slots and by rows, against the unkeyed claim", table)


if __name__ == "__main__":
    main()
