"""Enqueue latency inside the caller's transaction: what does fairqueue.enqueue(conn, ...) add to a web
request?

    python -m benchmarks.enqueue_latency [--samples 2000] [--rate 200] [--backlog 5000] [--processes 2]
                                         [--concurrency 10] [--no-peers] [--quick] [--no-doc]

One connection opens a transaction (a first statement, as the application's own work would), then
times fairqueue.enqueue(conn, ...) in it (the call), and the call plus its COMMIT; --samples times,
--rate a second on an absolute schedule. Cases:

- into 1 busy channel, and into one of 10,000 channels at random (every one of them has jobs);
- with no worker running, and with --processes `fairqueue worker` processes draining the same queue
  concurrently (a background producer keeps --backlog jobs queued, so they claim the whole time).

The floor is the hand-written loop's plain INSERT into its one table (with and without its workers
draining); PgQueuer 1.6's Queries.enqueue (asyncpg) is timed the same way with no worker running.
Reported: p50 / p95 / p99 in ms (client-side clock). Target: the call's p95 under 1 ms.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import time
from collections.abc import Callable
from typing import Any

import psycopg

import fairqueue
from benchmarks._common import Run, parser, percentiles, scalar, session, target_cell, worker_options
from benchmarks._systems import Fairqueue, Loop, PgQueuer, System
from benchmarks.peer_workers import pace

TARGET_MS = 1.0

Enqueue = Callable[[psycopg.Connection[Any], str], object]


def _fairqueue_enqueue(conn: psycopg.Connection[Any], channel: str) -> object:
    return fairqueue.enqueue(conn, "bench.noop", channel=channel)


def _loop_insert(conn: psycopg.Connection[Any], channel: str) -> object:
    return conn.execute("INSERT INTO bench_queue (kind) VALUES (%s)", (channel,))


def _fill(system: System, conn: psycopg.Connection[Any], channels: list[str], n: int) -> None:
    """``n`` jobs spread over ``channels`` (every channel gets one before any gets two)."""
    if isinstance(system, Fairqueue):
        specs = [{"kind": "bench.noop", "channel": channels[i % len(channels)]} for i in range(n)]
        for start in range(0, n, 10_000):
            with conn.transaction():
                fairqueue.enqueue_many(conn, specs[start : start + 10_000])
    else:
        system.add(conn, channels[0], n)


def _refiller(system: System, url: str, channels: list[str], backlog: int, stop: Any) -> None:
    """Keeps at least half of ``backlog`` jobs queued until ``stop``, topping up to ``backlog`` (in a
    process of its own, so that it takes no time from the measuring process)."""
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            n = scalar(conn, system.unfinished_sql)
            if n < backlog // 2:
                _fill(system, conn, random.sample(channels, min(len(channels), backlog)), backlog - n)
            else:
                stop.wait(0.02)


def measure(url: str, enqueue: Enqueue, channels: list[str], samples: int, rate: float) -> dict[str, Any]:
    call: list[float] = []
    call_commit: list[float] = []
    with psycopg.connect(url) as conn:

        def once(i: int) -> None:
            conn.execute("SELECT 1")  # the transaction is open, as after the application's own statements
            t0 = time.perf_counter()
            enqueue(conn, random.choice(channels))
            t1 = time.perf_counter()
            conn.commit()
            t2 = time.perf_counter()
            call.append((t1 - t0) * 1000)
            call_commit.append((t2 - t0) * 1000)

        pace.paced(once, rate, samples / rate, time.time() + 0.1)
    return {"call_ms": percentiles(call), "call_commit_ms": percentiles(call_commit), "samples": len(call)}


def run_case(run: Run, system: System, enqueue: Enqueue, channels: int, workers: bool, args: Any) -> dict[str, Any]:
    url = run.database("fq_enqueue")
    system.setup(url)
    names = ["busy"] if channels == 1 else [f"tenant{i}" for i in range(channels)]
    with psycopg.connect(url, autocommit=True) as conn:
        _fill(system, conn, names, max(args.backlog, channels))
        conn.execute("VACUUM ANALYZE")
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    refill = ctx.Process(target=_refiller, args=(system, url, names, max(args.backlog, channels), stop))
    running = system.start(url) if workers else None
    if running:
        refill.start()
    try:
        result = measure(url, enqueue, names, args.samples, args.rate)
    finally:
        stop.set()
        if running:
            refill.join()
            running.stop()
    name = {"fairqueue": "fairqueue.enqueue", "loop": "loop: plain INSERT"}[system.key]
    drained_by = system.label if workers else None
    return result | {"system": name, "key": system.key, "channels": channels, "workers": drained_by}


def run_pgqueuer(run: Run, python: str, args: Any) -> dict[str, Any]:
    system = PgQueuer(python)
    url = run.database("fq_enqueue")
    system.setup(url)
    system.prefill(url, "busy", args.backlog)
    out = system.script(url, "enqueue-latency", str(args.samples), str(1 / args.rate))
    raw = json.loads(out.strip().splitlines()[-1])
    return {
        "call_ms": percentiles(raw["call_ms"]),
        "call_commit_ms": percentiles(raw["call_commit_ms"]),
        "samples": len(raw["call_ms"]),
        "system": "PgQueuer 1.6 (Queries.enqueue, asyncpg)",
        "key": "pgqueuer",
        "channels": 1,
        "workers": None,
    }


def _cell(p: dict[str, float]) -> str:
    return f"{p['p50']:.3f} / {p['p95']:.3f} / {p['p99']:.3f} ms"


def table(results: list[dict[str, Any]], args: Any) -> list[str]:
    lines = [
        "| system | channels | workers draining | call p50 / p95 / p99 | call + commit p50 / p95 / p99 | "
        f"target: call p95 < {TARGET_MS:g} ms |",
        "|---|---:|---|---|---|---|",
    ]
    for r in results:
        met = r["call_ms"]["p95"] < TARGET_MS if r["key"] == "fairqueue" else None
        r["target_met"] = met
        lines.append(
            f"| {r['system']} | {r['channels']:,} | {r['workers'] or 'none'} | "
            f"{_cell(r['call_ms'])} | {_cell(r['call_commit_ms'])} | "
            f"{target_cell(r['key'], met)} |"
        )
    return lines


def main() -> None:
    p = parser(__doc__, peers=True)
    p.add_argument("--samples", type=int, help="enqueues timed per case (default 2,000; --quick 200)")
    p.add_argument("--rate", type=float, default=200, help="enqueues a second (default 200)")
    p.add_argument("--backlog", type=int, help="jobs kept queued (default 5,000; --quick 1,000)")
    worker_options(p, concurrency=10)
    args = p.parse_args()
    args.samples = args.samples or (200 if args.quick else 2_000)
    args.backlog = args.backlog or (1_000 if args.quick else 5_000)
    fq, loop = Fairqueue(args.processes, args.concurrency), Loop(args.processes)
    cases: list[tuple[System, Enqueue, int, bool]] = [
        (loop, _loop_insert, 1, False),
        (fq, _fairqueue_enqueue, 1, False),
        (fq, _fairqueue_enqueue, 10_000, False),
        (loop, _loop_insert, 1, True),
        (fq, _fairqueue_enqueue, 1, True),
        (fq, _fairqueue_enqueue, 10_000, True),
    ]
    with session("enqueue_latency", args, peers=True) as run:
        results = []
        for system, enqueue, channels, workers in cases:
            r = run_case(run, system, enqueue, channels, workers, args)
            results.append(r)
            print(f"{r['system']}, {channels:,} channels, workers: {r['workers']}: {_cell(r['call_ms'])}", flush=True)
        if run.python:
            results.append(run_pgqueuer(run, run.python, args))
        run.finish(
            results,
            f"Enqueue latency inside a transaction ({args.samples:,} enqueues per case, {args.rate:g}/s)",
            table(results, args),
            [
                f"Workers draining: {args.processes} worker processes of the same system, with {args.backlog:,} jobs "
                "kept queued by a background producer. The call is timed inside an open transaction; "
                "call + commit adds the COMMIT (a WAL flush with synchronous_commit=on)."
            ],
        )


if __name__ == "__main__":
    main()
