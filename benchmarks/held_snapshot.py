"""Steady load while a long transaction holds vacuum back: does each system keep its latency, its
producers' rate and its table sizes?

    python -m benchmarks.held_snapshot [--rate 1000] [--channels 100 --channels 1] [--before 20]
                                       [--hold 60] [--after 30] [--producers 4] [--concurrency 50]
                                       [--batch 50] [--no-peers] [--quick] [--no-doc]

For each channel count, each system runs on a fresh database, systems alternating (the order rotates
with every channel count): its workers start, then --producers processes enqueue one job per
transaction at --rate jobs/s in all, job i of each producer into channel c<i mod channels> (PgQueuer
has no channels). After --before seconds a separate session opens a REPEATABLE READ transaction,
reads a table (which takes its snapshot) and keeps it open for --hold seconds: no row version any
transaction deleted or updated after that snapshot can be pruned or vacuumed meanwhile. Production
goes on --after seconds past the hold. Measured per window (before / during / after the hold), from
the database's own timestamps: the producers' rate and enqueue->start p50/p95/max; and every
--sample-every seconds the hot tables' size (pg_total_relation_size) and dead rows.

Targets (issue 16, fairqueue): p95 during the hold within 2x of p95 before it (3x for a hold of 10
minutes or more: `--hold 600 --fairqueue-only`), producers keep their rate (>= 95% of it), and the hot
tables' dead rows back to under 10% of their peak by the end.

Writes benchmarks/results/held_snapshot-<time>.json and appends a section to docs/benchmarks.md.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from datetime import datetime
from typing import Any

import psycopg

from benchmarks._common import Run, now, parser, scalar, session, target_cell, verdict, wait_for, worker_options
from benchmarks._systems import Floor, System, side_by_side
from benchmarks.peer_workers import pace
from benchmarks.soak import tables
from benchmarks.steady import window

P95_RATIO = 2.0
P95_RATIO_LONG = 3.0  # for a hold of LONG_HOLD seconds or more
LONG_HOLD = 600.0
RATE_KEPT = 0.95
DEAD_LEFT = 0.10


def _p95_target(hold: float) -> float:
    return P95_RATIO_LONG if hold >= LONG_HOLD else P95_RATIO


def _sizes(conn: psycopg.Connection[Any], key: str, t0: float) -> dict[str, Any]:
    hot = tables(conn, key)
    return {
        "t": round(time.monotonic() - t0, 1),
        "bytes": sum(t["bytes"] for t in hot.values()),
        "dead": sum(t["dead"] for t in hot.values()),
        "tables": {name: {"bytes": t["bytes"], "dead": t["dead"]} for name, t in hot.items()},
    }


def _hold(url: str, opened: threading.Event, release: threading.Event) -> None:
    """A REPEATABLE READ transaction that holds its snapshot until ``release``."""
    with psycopg.connect(url) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute("SELECT count(*) FROM pg_class").fetchone()  # the snapshot is taken here
        opened.set()
        release.wait()
        conn.rollback()


def run_one(run: Run, system: System, channels: int, args: Any) -> dict[str, Any]:
    url = run.database("fq_held")
    system.setup(url)
    os.environ["FAIRQUEUE_BENCH_CHANNELS"] = str(channels)  # read by benchmarks/_producer.py
    workers = system.start(url)
    samples: list[dict[str, Any]] = []
    total = args.before + args.hold + args.after
    try:
        start_at = time.time() + 1.0
        with (
            concurrent.futures.ThreadPoolExecutor(2) as pool,
            psycopg.connect(url, autocommit=True) as conn,
        ):
            producing = pool.submit(system.produce, url, args.rate, total, start_at, args.producers)
            opened, release = threading.Event(), threading.Event()
            t_mono = time.monotonic()
            marks: dict[str, datetime] = {}

            def sample_until(at: float) -> None:
                while time.time() < at:
                    samples.append(_sizes(conn, system.key, t_mono) | {"phase": phase})
                    pace.wait_until(min(at, time.time() + args.sample_every))

            phase = "before"
            pace.wait_until(start_at + min(args.warmup, args.before))
            marks["before"] = now(conn)
            sample_until(start_at + args.before)
            holder = pool.submit(_hold, url, opened, release)
            opened.wait(30)
            marks["hold"] = now(conn)
            phase = "hold"
            sample_until(start_at + args.before + args.hold)
            release.set()
            holder.result()
            marks["after"] = now(conn)
            phase = "after"
            sample_until(start_at + total)
            marks["end"] = now(conn)
            producers = producing.result()
            wait_for(conn, f"SELECT ({system.unfinished_sql}) = 0", timeout=900, what="the backlog to drain")
            phase = "drained"
            samples.append(_sizes(conn, system.key, t_mono) | {"phase": phase})
            windows = {
                "before": window(conn, system.times_sql, marks["before"], marks["hold"]),
                "hold": window(conn, system.times_sql, marks["hold"], marks["after"]),
                "after": window(conn, system.times_sql, marks["after"], marks["end"]),
            }
            backlog = scalar(conn, system.unfinished_sql)
    finally:
        workers.stop()
    return judge(system, channels, windows, samples, producers, backlog, p95_target=_p95_target(args.hold))


def judge(
    system: System,
    channels: int,
    windows: dict[str, dict[str, Any]],
    samples: list[dict[str, Any]],
    producers: list[dict[str, Any]],
    backlog: int,
    p95_target: float = P95_RATIO,
) -> dict[str, Any]:
    before, hold = windows["before"], windows["hold"]
    p95_ratio = hold["p95_ms"] / before["p95_ms"] if hold["p95_ms"] and before["p95_ms"] else None
    rate_kept = hold["enqueued_per_s"] / before["enqueued_per_s"] if before["enqueued_per_s"] else None
    peak_dead = max((s["dead"] for s in samples), default=0)
    end = samples[-1] if samples else {"dead": 0, "bytes": 0}
    before_hold = [s for s in samples if s["phase"] == "before"]
    bytes_before = before_hold[-1]["bytes"] if before_hold else None
    bytes_peak = max((s["bytes"] for s in samples), default=0)
    met = None
    if system.key == "fairqueue" and p95_ratio is not None and rate_kept is not None:
        met = p95_ratio <= p95_target and rate_kept >= RATE_KEPT and end["dead"] <= DEAD_LEFT * max(peak_dead, 1)
    return {
        "system": system.label,
        "key": system.key,
        "channels": channels,
        "windows": windows,
        "p95_ratio": p95_ratio,
        "rate_kept": rate_kept,
        "dead_peak": peak_dead,
        "dead_end": end["dead"],
        "bytes_before_hold": bytes_before,
        "bytes_peak": bytes_peak,
        "bytes_end": end["bytes"],
        "samples": samples,
        "producers": producers,
        "backlog_left": backlog,
        "target_met": met,
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:,.0f}"


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| channels | system | producers before / hold / after (jobs/s) | p95 before / hold / after (ms) | "
        "p95 hold / before | hot tables KiB before hold / peak / end | dead rows peak / end | target |",
        "|---:|---|---|---|---:|---|---|---|",
    ]
    for r in results:
        w = r["windows"]
        rates = " / ".join(f"{w[k]['enqueued_per_s']:,}" for k in ("before", "hold", "after"))
        p95 = " / ".join(_ms(w[k]["p95_ms"]) for k in ("before", "hold", "after"))
        ratio = "-" if r["p95_ratio"] is None else f"{r['p95_ratio']:.2f}x"
        lines.append(
            f"| {r['channels']:,} | {r['system']} | {rates} | {p95} | {ratio} | "
            f"{_kib(r['bytes_before_hold'])} / {_kib(r['bytes_peak'])} / {_kib(r['bytes_end'])} | "
            f"{r['dead_peak']:,} / {r['dead_end']:,} | {target_cell(r['key'], r['target_met'])} |"
        )
    return lines


def main() -> None:
    p = parser(__doc__.split("\n\n")[0], peers=True)
    p.add_argument("--rate", type=float, default=1000.0, help="jobs/s from all producers (default 1,000)")
    p.add_argument("--channels", type=int, action="append", help="channel counts (default 100 and 1)")
    p.add_argument("--before", type=float, help="seconds of load before the hold (default 20; --quick 3)")
    p.add_argument("--hold", type=float, help="seconds the snapshot is held (default 60; --quick 4)")
    p.add_argument("--after", type=float, help="seconds of load after the hold (default 30; --quick 3)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds at the start not measured (default 2)")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between table samples (default 5)")
    p.add_argument("--producers", type=int, default=4, help="producer processes (default 4)")
    p.add_argument("--with-floor", action="store_true", help="also run the fair SQL floor (benchmarks/floor.py)")
    p.add_argument("--fairqueue-only", action="store_true", help="run fairqueue alone (e.g. for a 10-minute hold)")
    worker_options(p, concurrency=50, batch=50)
    args = p.parse_args()
    quick = args.quick
    args.before = args.before or (3.0 if quick else 20.0)
    args.hold = args.hold or (4.0 if quick else 60.0)
    args.after = args.after or (3.0 if quick else 30.0)
    if quick:
        args.rate, args.warmup, args.sample_every = min(args.rate, 200.0), 0.5, 1.0
    counts = args.channels or [100, 1]
    if min(counts) < 1 or args.rate <= 0 or args.producers < 1 or args.warmup >= args.before:
        p.error("--channels, --rate and --producers must be positive, and --warmup shorter than --before")
    with session("held_snapshot", args, peers=True) as run:
        systems = side_by_side(run.python, args.processes, args.concurrency, args.batch)
        if args.with_floor:
            systems.append(Floor(args.processes, args.batch))
        if args.fairqueue_only:
            systems = [s for s in systems if s.key == "fairqueue"]
        results = []
        for i, channels in enumerate(counts):
            for system in systems[i % len(systems) :] + systems[: i % len(systems)]:
                r = run_one(run, system, channels, args)
                results.append(r)
                w = r["windows"]
                print(
                    f"{channels:,} channel(s), {system.label}: p95 {_ms(w['before']['p95_ms'])} -> "
                    f"{_ms(w['hold']['p95_ms'])} ms during the hold, producers {w['before']['enqueued_per_s']:,} -> "
                    f"{w['hold']['enqueued_per_s']:,}/s, dead rows peak {r['dead_peak']:,}, end {r['dead_end']:,}",
                    flush=True,
                )
        for r in results:
            if r["key"] == "fairqueue":
                print(f"fairqueue, {r['channels']:,} channel(s): {verdict(r['target_met']).strip('*')}")
        run.finish(
            results,
            f"Steady {args.rate:,.0f} jobs/s while a snapshot is held {args.hold:g} s",
            table(results),
            [
                f"{args.producers} producer processes, one job per transaction; {args.processes} worker processes "
                f"per system, claim batch {args.batch}. Load {args.before:g} s before the hold, {args.hold:g} s "
                f"during it, {args.after:g} s after; hot tables sampled every {args.sample_every:g} s (sizes "
                "with indexes and TOAST; dead rows from pg_stat_user_tables). Targets (fairqueue): p95 during "
                f"the hold <= {_p95_target(args.hold):g}x before, producers >= {RATE_KEPT:.0%} of their rate, "
                f"dead rows at the end <= {DEAD_LEFT:.0%} of their peak.",
            ],
        )


if __name__ == "__main__":
    main()
