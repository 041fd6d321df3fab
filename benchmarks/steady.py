"""Steady producers + workers: does each system sustain the producers' rate, and how long does a job
wait from enqueue to start?

    python -m benchmarks.steady [--rates 200,2000,5000] [--seconds 15] [--warmup 2] [--producers 4]
                                [--concurrency 50] [--batch 50] [--no-peers] [--quick] [--no-doc]

For each rate, each system runs on a fresh database, systems alternating (the order rotates with
every rate): its workers start and listen, then --producers processes each enqueue one job per
transaction at rate/producers jobs/s on an absolute schedule (job i due at start + i/rate: a producer
that falls behind sends back to back, it never drifts), for --warmup + --seconds. Measured over the
--seconds window after the warm-up, from the database's own timestamps:

- producers reached: jobs enqueued in the window / its length (what the producers achieved; on a
  small machine they may fall short of the rate asked for, and then the target cannot be judged);
- workers started: jobs started in the window / its length, and the backlog (jobs enqueued and not
  finished) at the start and the end of the window: it "grew" if it rose by more than 100 ms worth
  of the rate;
- enqueue->start p50/p95/p99/max of the jobs enqueued in the window (after the producers stop, the
  workers drain what is left, so late jobs count with their real wait).

Systems: fairqueue (2 `fairqueue worker` processes, LISTEN/NOTIFY), PgQueuer 1.6 tuned (2 processes,
continuous mode: LISTEN on its insert trigger's notifications) and the hand-written loop (2
processes, polling every 1 ms when idle: it has no notifications). Where each system's timestamps
come from: see benchmarks/_systems.py. Target (fairqueue): every rate up to 5,000 jobs/s sustained
with p95 under 15 ms, and p95 under 10 ms at 200 jobs/s.
"""

from __future__ import annotations

import concurrent.futures
import time
from datetime import datetime
from typing import Any

import psycopg

from benchmarks._common import Run, now, parser, scalar, session, target_cell, wait_for, worker_options
from benchmarks._systems import System, side_by_side
from benchmarks.peer_workers import pace

WINDOW_SQL = """
WITH t AS ({times}), w AS (
    SELECT extract(epoch FROM started - enqueued) * 1000 AS wait_ms, enqueued, started FROM t
)
SELECT count(*) FILTER (WHERE enqueued >= %(t0)s AND enqueued < %(t1)s),
       count(*) FILTER (WHERE started >= %(t0)s AND started < %(t1)s),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY wait_ms)
           FILTER (WHERE enqueued >= %(t0)s AND enqueued < %(t1)s),
       max(wait_ms) FILTER (WHERE enqueued >= %(t0)s AND enqueued < %(t1)s)
FROM w
"""


def target_p95_ms(rate: float) -> float | None:
    """The issue's bar for fairqueue: p95 under 10 ms at a light 200 jobs/s, under 15 ms up to 5,000."""
    if rate <= 200:
        return 10.0
    return 15.0 if rate <= 5000 else None


def window(conn: psycopg.Connection[Any], times_sql: str, t0: datetime, t1: datetime) -> dict[str, Any]:
    row = conn.execute(WINDOW_SQL.format(times=times_sql), {"t0": t0, "t1": t1}).fetchone()
    assert row is not None
    enqueued, started, pcts, worst = row
    seconds = (t1 - t0).total_seconds()
    p50, p95, p99 = pcts or (None, None, None)
    return {
        "seconds": round(seconds, 3),
        "enqueued": enqueued,
        "started": started,
        "enqueued_per_s": round(enqueued / seconds),
        "started_per_s": round(started / seconds),
        "p50_ms": p50,
        "p95_ms": p95,
        "p99_ms": p99,
        "max_ms": worst,
    }


def run_one(run: Run, system: System, rate: float, args: Any) -> dict[str, Any]:
    url = run.database("fq_steady")
    system.setup(url)
    workers = system.start(url)
    try:
        start_at = time.time() + 1.0
        with (
            concurrent.futures.ThreadPoolExecutor(1) as pool,
            psycopg.connect(url, autocommit=True) as conn,
        ):
            producing = pool.submit(system.produce, url, rate, args.warmup + args.seconds, start_at, args.producers)
            pace.wait_until(start_at + args.warmup)
            t0, backlog0 = now(conn), scalar(conn, system.unfinished_sql)
            pace.wait_until(start_at + args.warmup + args.seconds)
            t1, backlog1 = now(conn), scalar(conn, system.unfinished_sql)
            producers = producing.result()
            wait_for(conn, f"SELECT ({system.unfinished_sql}) = 0", timeout=600, what="the backlog to drain")
            measured = window(conn, system.times_sql, t0, t1)
    finally:
        workers.stop()
    grew = backlog1 > backlog0 + 0.1 * rate
    result = measured | {
        "system": system.label,
        "key": system.key,
        "rate": rate,
        "backlog_start": backlog0,
        "backlog_end": backlog1,
        "backlog_grew": grew,
        "producers": producers,
        "producers_max_late_ms": max(p["max_late_ms"] for p in producers),
    }
    reached = measured["enqueued_per_s"] >= 0.95 * rate
    bar = target_p95_ms(rate)
    if system.key != "fairqueue" or bar is None:
        result["target_met"] = None
    elif not reached:
        result["target_met"] = None
        result["target_note"] = f"producers reached only {measured['enqueued_per_s']:,} jobs/s"
    else:
        result["target_met"] = (not grew) and measured["p95_ms"] is not None and measured["p95_ms"] < bar
    return result


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| rate asked | system | producers reached | workers started | backlog start -> end | "
        "enqueue->start p50 / p95 / p99 / max | target (fairqueue's) | |",
        "|---:|---|---:|---:|---|---|---|---|",
    ]
    for r in results:
        bar = target_p95_ms(r["rate"])
        target = f"sustained, p95 < {bar:g} ms" if bar else "no target"
        lines.append(
            f"| {r['rate']:,.0f}/s | {r['system']} | {r['enqueued_per_s']:,}/s | {r['started_per_s']:,}/s | "
            f"{r['backlog_start']:,} -> {r['backlog_end']:,}{' (grew)' if r['backlog_grew'] else ''} | "
            f"{_ms(r['p50_ms'])} / {_ms(r['p95_ms'])} / {_ms(r['p99_ms'])} / {_ms(r['max_ms'])} ms | {target} | "
            f"{target_cell(r['key'], r['target_met'])}"
            f"{' (' + r['target_note'] + ')' if r.get('target_note') else ''} |"
        )
    return lines


def main() -> None:
    p = parser(__doc__, peers=True)
    p.add_argument("--rates", help="comma-separated jobs/s (default 200,2000,5000; --quick 200,1000)")
    p.add_argument("--seconds", type=float, help="measured window per run (default 15; --quick 2)")
    p.add_argument("--warmup", type=float, help="seconds of production before the window (default 2; --quick 0.5)")
    p.add_argument("--producers", type=int, default=4, help="producer processes (default 4)")
    worker_options(p, concurrency=50, batch=50)
    args = p.parse_args()
    args.rates = args.rates or ("200,1000" if args.quick else "200,2000,5000")
    args.seconds = args.seconds or (2.0 if args.quick else 15.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 2.0)
    rates = [float(r) for r in args.rates.split(",")]
    with session("steady", args, peers=True) as run:
        systems = side_by_side(run.python, args.processes, args.concurrency, args.batch)
        results = []
        for i, rate in enumerate(rates):
            for system in systems[i % len(systems) :] + systems[: i % len(systems)]:
                r = run_one(run, system, rate, args)
                results.append(r)
                print(
                    f"{rate:,.0f}/s {system.label}: producers {r['enqueued_per_s']:,}/s, started "
                    f"{r['started_per_s']:,}/s, backlog {r['backlog_start']} -> {r['backlog_end']}, p95 "
                    f"{_ms(r['p95_ms'])} ms",
                    flush=True,
                )
        results.sort(key=lambda r: (r["rate"], ["fairqueue", "pgqueuer", "loop"].index(r["key"])))
        run.finish(
            results,
            f"Steady producers + workers ({args.seconds:g} s per run)",
            table(results),
            [
                f"{args.producers} producer processes, one job per transaction, paced on absolute deadlines; "
                f"{args.processes} worker processes per system, claim batch {args.batch}. Latency from each "
                "system's own database timestamps (benchmarks/_systems.py).",
            ],
        )


if __name__ == "__main__":
    main()
