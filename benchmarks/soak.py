"""Soak: do a worker's memory and the hot tables stay flat over 1,000,000 jobs?

    python -m benchmarks.soak [--jobs 1000000] [--checkpoint 100000] [--rate 3000] [--producers 4]
                              [--processes 2] [--concurrency 10] [--sample-every 2] [--no-loop]
                              [--quick] [--no-doc]

--producers processes enqueue --jobs no-op jobs in all, one per transaction, at --rate jobs/s in all
on an absolute schedule, while --processes `fairqueue worker` processes run them. Every
--sample-every seconds the workers' resident memory (VmRSS from /proc/<pid>/status) and the number
of finished jobs are sampled. When --checkpoint jobs have finished, and again at the end (every job
enqueued and finished), the hot tables are measured: pg_total_relation_size, live and dead tuples,
and the HOT share of updates (n_tup_hot_upd / n_tup_upd) from pg_stat_user_tables, cumulative and
for the stretch between the checkpoint and the end.

Targets: every worker's RSS at the end within 10% of its RSS at the checkpoint (flat), and no hot
table (job, running_job, channel, channel_active, channel_wakeup, channel_debt, scheduled_job) larger
at the end than at the checkpoint. The hand-written loop runs the same soak after fairqueue as the floor (its one
table, its worker processes' memory), unless --no-loop.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import psycopg

from benchmarks._common import Run, parser, scalar, session, target_cell, worker_options
from benchmarks._systems import Fairqueue, Loop, System, rss_kib

HOT_TABLES = {
    "fairqueue": (
        "fairqueue",
        ["job", "running_job", "channel", "channel_active", "channel_wakeup", "channel_debt", "scheduled_job"],
    ),
    "loop": ("public", ["bench_queue"]),
    "floor": ("public", ["floor_job", "floor_running", "floor_channel", "floor_wakeup"]),
    "pgqueuer": ("public", ["pgqueuer", "pgqueuer_statistics"]),
}
RSS_GROWTH = 1.10


def tables(conn: psycopg.Connection[Any], key: str) -> dict[str, dict[str, Any]]:
    schema, names = HOT_TABLES[key]
    rows = conn.execute(
        "SELECT relname, pg_total_relation_size(relid), n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, "
        "autovacuum_count FROM pg_stat_user_tables WHERE schemaname = %s AND relname = ANY(%s)",
        (schema, names),
    ).fetchall()
    return {
        r[0]: {"bytes": r[1], "live": r[2], "dead": r[3], "updates": r[4], "hot_updates": r[5], "autovacuums": r[6]}
        for r in rows
    }


def soak(run: Run, system: System, args: Any) -> dict[str, Any]:
    url = run.database("fq_soak")
    system.setup(url)
    workers = system.start(url)
    samples: list[dict[str, Any]] = []
    checkpoint: dict[str, Any] = {}
    finished_sql = f"SELECT count(*) FROM ({system.times_sql}) t"
    try:
        with (
            concurrent.futures.ThreadPoolExecutor(1) as pool,
            psycopg.connect(url, autocommit=True) as conn,
        ):
            started = time.time()
            producing = pool.submit(
                system.produce, url, args.rate, 10 * args.jobs / args.rate + 60, started + 1, args.producers, args.jobs
            )
            while True:
                time.sleep(args.sample_every)
                done = producing.done()
                finished = scalar(conn, finished_sql)
                rss = {str(pid): rss_kib(pid) for pid in workers.pids}
                samples.append({"t": round(time.time() - started, 1), "finished": finished, "rss_kib": rss})
                print(f"{system.label}: {finished:,} jobs finished, RSS {rss} KiB", flush=True)
                if not checkpoint and finished >= args.checkpoint:
                    checkpoint = {"finished": finished, "rss_kib": rss, "tables": tables(conn, system.key)}
                if done and scalar(conn, system.unfinished_sql) == 0:
                    break
            producers = producing.result()
            end = {"finished": finished, "rss_kib": rss, "tables": tables(conn, system.key)}
    finally:
        workers.stop()
    enqueued = sum(p["sent"] for p in producers)
    seconds = max(p["seconds"] for p in producers)
    return {
        "system": system.label,
        "key": system.key,
        "enqueued": enqueued,
        "producers_per_s": round(enqueued / seconds) if seconds else None,
        "checkpoint": checkpoint,
        "end": end,
        "samples": samples,
    } | targets(checkpoint, end)


def targets(checkpoint: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    if not checkpoint:
        return {"rss_met": None, "tables_met": None}
    rss_met = all(
        (end["rss_kib"].get(pid) or 0) <= RSS_GROWTH * (kib or 0) for pid, kib in checkpoint["rss_kib"].items()
    )
    tables_met = all(end["tables"][t]["bytes"] <= c["bytes"] for t, c in checkpoint["tables"].items())
    return {"rss_met": rss_met, "tables_met": tables_met}


def _hot(before: dict[str, Any] | None, after: dict[str, Any]) -> str:
    """HOT share of updates: cumulative, and since ``before`` when given."""
    if not after["updates"]:
        return "no updates"
    share = f"{after['hot_updates'] / after['updates']:.0%}"
    if before is None:
        return share
    updates = after["updates"] - before["updates"]
    since = f"{(after['hot_updates'] - before['hot_updates']) / updates:.0%}" if updates else "-"
    return f"{share} ({since} since)"


def _mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}"


def table(results: list[dict[str, Any]], args: Any) -> list[str]:
    lines = []
    for r in results:
        c, e = r["checkpoint"], r["end"]
        if not c:
            lines += [f"{r['system']}: fewer than {args.checkpoint:,} jobs finished, no checkpoint.", ""]
            continue
        lines += [
            f"**{r['system']}**: {r['enqueued']:,} jobs enqueued (producers {r['producers_per_s'] or 0:,}/s); "
            f"checkpoint at {c['finished']:,} finished, end at {e['finished']:,}.",
            "",
            "| worker process | RSS at checkpoint | at end | max over the run | target: end <= 1.1x checkpoint |",
            "|---|---:|---:|---:|---|",
        ]
        for i, (pid, kib) in enumerate(c["rss_kib"].items()):
            peak = max((s["rss_kib"].get(pid) or 0) for s in r["samples"])
            met = (e["rss_kib"].get(pid) or 0) <= RSS_GROWTH * (kib or 0)
            lines.append(
                f"| worker {i + 1} | {_mib(kib)} MiB | {_mib(e['rss_kib'].get(pid))} MiB | {_mib(peak)} MiB | "
                f"{target_cell(r['key'], met)} |"
            )
        lines += [
            "",
            "| table | size at checkpoint | at end | dead tuples (checkpoint / end) | HOT share of updates at end "
            "(since checkpoint) | target: end <= checkpoint |",
            "|---|---:|---:|---|---|---|",
        ]
        for name, ct in c["tables"].items():
            et = e["tables"][name]
            met = et["bytes"] <= ct["bytes"]
            lines.append(
                f"| {name} | {ct['bytes'] / 1024:,.0f} KiB | {et['bytes'] / 1024:,.0f} KiB | {ct['dead']:,} / "
                f"{et['dead']:,} | {_hot(ct, et)} | {target_cell(r['key'], met)} |"
            )
        lines.append("")
    return lines[:-1]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--jobs", type=int, help="jobs in all (default 1,000,000; --quick 20,000)")
    p.add_argument("--checkpoint", type=int, help="jobs done at the 1st measurement (default 100,000; --quick 2,000)")
    p.add_argument("--rate", type=float, default=3000, help="jobs/s of all producers together (default 3,000)")
    p.add_argument("--producers", type=int, default=4, help="producer processes (default 4)")
    worker_options(p, concurrency=10)
    p.add_argument("--sample-every", type=float, help="seconds between samples (default 2; --quick 0.5)")
    p.add_argument("--no-loop", action="store_true", help="skip the hand-written loop's soak")
    args = p.parse_args()
    args.jobs = args.jobs or (20_000 if args.quick else 1_000_000)
    args.checkpoint = args.checkpoint or (2_000 if args.quick else 100_000)
    args.sample_every = args.sample_every or (0.5 if args.quick else 2.0)
    systems: list[System] = [Fairqueue(args.processes, args.concurrency)]
    if not args.no_loop:
        systems.append(Loop(args.processes, args.concurrency))
    with session("soak", args) as run:
        results = [soak(run, s, args) for s in systems]
        run.finish(
            results,
            f"Soak of {args.jobs:,} jobs at {args.rate:,.0f} jobs/s (checkpoint at {args.checkpoint:,})",
            table(results, args),
            [
                f"{args.producers} producer processes (one job per transaction), {args.processes} worker processes. "
                "Table figures from pg_total_relation_size and pg_stat_user_tables (cumulative counters)."
            ],
        )


if __name__ == "__main__":
    main()
